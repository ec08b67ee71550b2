// Package listener turns PostgreSQL notifications into wake-ups for partition
// workers.
//
// # Mechanism
//
// One dedicated connection per process runs LISTEN on the event channel
// and waits for notifications on it. An append notifies only the partitions a consumer
// sleeps on (the topic's wake-up mode `waiting`, the default; mode `always`
// notifies every append): at commit, one notification per append call and
// topic whose payload names those partitions and the highest offset written
// in each ("3:0/1041,5/1040"). While events flow, consumers read the tails
// themselves and producers send almost nothing (the root package's doc has
// the protocol). The listener decodes a payload and calls the Sink once per
// partition, so only the workers that may have work look, and a worker
// whose position is already past the offset stays asleep.
//
// # Notifications are hints
//
// A notification is lost when the connection drops, and a half-open TCP
// connection may deliver nothing for minutes before the kernel notices.
// Hence:
//
//   - The connection is dialled with TCP keepalive (idle 5 s, interval 1 s,
//     3 probes) and TCP_USER_TIMEOUT, so a dead peer is noticed in seconds.
//   - A wait for a notification sends nothing. Every CanaryInterval, the
//     listening session is pinged (or, with Config.Notify, a canary
//     notification is sent on a channel of this listener's own through
//     another connection); if no answer (no canary) has come back for
//     CanaryTimeout while sends succeed, or a ping goes unanswered past
//     the interval, the connection is closed and dialled again. A ping
//     notifies nobody: a notification wakes every listening session of the
//     database, so canaries sent as notifications by N processes would
//     cost the server N² wake-ups each interval.
//   - Reconnection follows a lost connection within 25–50 ms (jittered, so
//     that the replicas of a restarted server do not all dial at once) and
//     backs off, up to 5 s, while dialling fails, and while sessions die
//     within a second of their connect (100 ms doubling to 5 s, jittered):
//     a server that ends every session at once costs a few reconnects, not
//     a tight loop. A lost session is logged as a warning ("listening
//     session lost, reconnecting", with the error), a repeated failure
//     once per 10 s, with the count of repeats ("repeated"), and the
//     reconnect that ends it once. A channel change (SetChannel) ends the
//     session too, by a cause of its own: it is logged at info level and
//     connects again at once.
//   - After every (re)connect, once LISTEN is in place, the Sink's Connected
//     method is called, so that workers look for events committed while
//     nobody listened.
//   - Workers still poll on their own schedule: a wake-up is an optimisation,
//     never the only way to find work.
//
// # The session is lent between two waits
//
// Acquire lends the listening session for a few statements: the wait for
// a notification is interrupted (a deadline on the socket, which loses
// nothing: the connection keeps what it read), the borrower runs its
// statements and gives the session back, and the wait goes on.
// Notifications that arrive meanwhile are kept by the connection and
// handled after the release. A consumer runs its upkeep this way (the
// lease heartbeat, the subscription's heartbeat, the poll), so that a
// process needs no pool session while it has no events: the listener's
// session and its watcher's are all it holds. A session given back broken
// or inside a transaction is closed, and the listener connects again.
//
// A notification is also untrusted: anyone who can connect may notify the
// channel, with any payload, and another installation in the same database
// may share it. The Sink takes a payload as "look at these partitions",
// never as "these offsets exist": a worker claims on it and believes only
// what the claim finds. SetChannel moves a running listener to another
// channel, when the topic's channel changes.
package listener
