// Package console is pgevents' operator console: web pages, served by the
// consumer binary (`consumer console`, or `consumer run` with a console
// section in db-event-consumer.yml), that show what the database says
// about the log and its consumer groups, and let an operator act on them.
//
// # Pages
//
//   - Overview: each topic with its partitions, offset scope, retention,
//     appending rate, and the roles that keep it moving (the elected
//     watcher, the sequencer of a sequenced topic with its last tick and
//     the events staged, maintenance's last pass, the notification
//     queue), red when nobody holds one; each group with its state,
//     whether it keeps up and since when it does not, its lag, lag age
//     and handling rate, and the last hour of its rate and lag.
//   - Group: its last hour (rate, lag, lag age, dead letters per
//     minute); per partition, the owner replica, its epoch and lease
//     expiry, the group's position, the partition's head, the lag, the
//     rate, the halt and the parked hosts; pause and resume, reset to
//     earliest/latest/offset/time after a confirmation that shows how many
//     events it replays or skips, unhalt.
//   - Dead letters: filtered by group, host, event type, reason and time;
//     each one's events, payloads and error; replay and discard, one or
//     many.
//   - Events: a partition browsed by offset or time; events found by host,
//     type or event id; each event's JSON.
//   - Host and event: the path of a host, or of one event, through every
//     group of its topic: where it is, which group handled it (and by
//     when), which is behind it and by how many events, and what blocks it
//     (a dead letter, a parked host, a halt, a paused or dead group, a
//     lease that expired).
//   - Replicas: the live replicas, their partitions and heartbeat age.
//   - Audit: what operators did from the console.
//
// Figures marked live refresh by themselves: a small embedded script
// (assets/console.js, no build step, no CDN) fetches the page again every
// few seconds and swaps the elements marked data-live. Pages work without
// it.
//
// # Charts and samples
//
// The history the pages draw comes from the database, not from the
// process that serves them: maintenance writes a sample of each topic and
// its groups once per pgevents.SamplePeriod (10 s; migration 0022; one writer per
// topic and period, however many processes run it), and keeps the last
// hour and a minute. Rates are a sample's events over the seconds since the
// one before it; a figure without a sample shows "—", its title saying
// why. Charts are inline SVG drawn by the server (chart.go), each series
// carrying its points as data-t and data-v attributes. A console reads
// samples and writes none.
//
// # Actions and their guarantees
//
// Actions use the operator API the CLI uses: offsets.Reset,
// offsets.SetState, offsets.Unhalt, and Consumer.ReplayDeadLetter and
// DiscardDeadLetter through a [Resolver] (replay runs the group's
// handlers, which a console is given by the process that serves it).
// Each action writes a log line and a row of console_audit (migration
// 0011), which the pages show: a reset, a pause, a resume and an unhalt
// write their row in the action's own transaction, so the row exists if
// and only if the action committed; a replay or discard writes it right
// after, with the outcome. A reset is previewed first: the console runs
// offsets.Reset in a transaction it rolls back and counts, in that
// transaction, the events each partition would replay or skip; the
// confirmation carries the positions previewed, and the reset commits only
// if it moves the group exactly there (a "latest" reset may go further,
// when events were appended since, and then says how many more it skips);
// otherwise nothing changes and a new confirmation is shown.
//
// # Security
//
//   - Actions need the token (Options.Token, there is no default): a
//     browser signs in with a form that sets a session cookie (HttpOnly,
//     SameSite=Strict, Secure when the request came over TLS or through a
//     proxy that sends X-Forwarded-Proto: https), a script
//     sends "Authorization: Bearer TOKEN" (the scheme's name in any
//     case, as RFC 7235 has it). A request without valid credentials
//     gets 401, and changes nothing.
//   - A wrong token counts, in the sign-in form and in an Authorization
//     header alike: after five in a minute from one client address, that
//     address gets 429 until the minute ends, the right token included.
//     The check and the count are one step under a lock, so a burst of
//     concurrent guesses gets five comparisons. The client address is the
//     connecting peer's, or, from a proxy of Options.TrustedProxies, the
//     right-most address of X-Forwarded-For that is not a trusted proxy's.
//   - Every action from a browser session carries the session's CSRF token
//     (a form field, or the X-CSRF-Token header); without it the request
//     gets 403 and changes nothing. Cross-site requests (Origin or
//     Sec-Fetch-Site) are refused too.
//   - A request whose Host header names another host than the console's
//     (Options.Addr, its loopback forms, Options.AllowedHosts) gets 421:
//     a page of another site whose name was made to resolve to the
//     console's address (DNS rebinding) reads nothing.
//   - Options.ReadOnly serves the pages without a single action form and
//     refuses every action request with 403, whatever its credentials.
//   - Everything shown is escaped by html/template: a payload, an error or a
//     host id holding "<script>" is shown as text. The pages send a
//     Content-Security-Policy that allows only the console's own script and
//     stylesheet. The message a page shows after an action is the
//     console's own text, chosen by a code in the URL; an action's redirect
//     goes to a plain path of the console only.
//   - Every filter reaches the database as a statement parameter, never as
//     SQL text; every statement of this package is a named constant that
//     goes through schema.SQL.
//   - The console shows the database's user, host and name, never its
//     password, which is also removed from any error shown.
//
// Pages need no token unless Options.PagesNeedToken: by default anyone who
// reaches the console's address reads the log, payloads included. Bind it
// to a private address, or set PagesNeedToken.
//
// # Use
//
//	c, err := console.New(pool, console.Options{Token: token, Schema: "pgevents"})
//	...
//	srv, err := console.Listen("127.0.0.1:8080", c)
//	...
//	err = srv.Run(ctx) // until ctx ends
//
// A Console is an http.Handler: mount it in a server of your own (behind
// TLS, say) instead of Listen.
package console
