package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

// dlFilter is the dead-letter list's filter; every field reaches the
// database as a parameter of deadLettersSQL.
type dlFilter struct {
	Group  string
	Topic  int
	Host   string
	Type   string
	Reason string
	Since  string // as typed: RFC 3339 or a form's local date-time (UTC)
	Until  string
}

// dlRow is a dead letter in the list.
type dlRow struct {
	ID          int64
	Group       string
	Topic       int
	Partition   int
	FirstOffset int64
	LastOffset  int64
	Hosts       []string
	Types       []string
	Events      int
	Error       string
	Attempts    int
	LastFailed  time.Time
	ParkHosts   bool
	Parked      int64
	CanResolve  bool // the console has the group's handlers
}

// deadLettersData is the dead-letter list's.
type deadLettersData struct {
	Filter  dlFilter
	Rows    []dlRow
	Groups  []groupRef
	Limit   int
	Audit   []auditEntry
	Done    string
	Missing []string // groups listed whose handlers the console lacks
}

type groupRef struct {
	Group string
	Topic int
}

// parseTime reads a filter's time: RFC 3339, or a local date-time of a
// form (taken as UTC); nil when empty.
func parseTime(name, v string) (*time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04", "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return &t, nil
		}
	}
	return nil, badRequest("%s %q is not a time (RFC 3339, or YYYY-MM-DDTHH:MM in UTC)", name, v)
}

func (c *Console) deadLettersPage(r *http.Request) (string, string, any, error) {
	q := r.URL.Query()
	f := dlFilter{Group: q.Get("group"), Host: q.Get("host"), Type: q.Get("type"), Reason: q.Get("reason"),
		Since: q.Get("since"), Until: q.Get("until")}
	if t := q.Get("topic"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil {
			return "", "", nil, badRequest("topic %q is not a number", t)
		}
		f.Topic = n
	}
	since, err := parseTime("since", f.Since)
	if err != nil {
		return "", "", nil, err
	}
	until, err := parseTime("until", f.Until)
	if err != nil {
		return "", "", nil, err
	}
	ctx, cancel := c.queryContext(r)
	defer cancel()
	d := deadLettersData{Filter: f, Limit: c.opts.PageSize * 4, Done: flash(q)}
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, deadLettersSQL), f.Group, f.Topic, f.Host, f.Type, f.Reason, since, until, d.Limit)
	if err != nil {
		return "", "", nil, fmt.Errorf("console: dead letters: %w", err)
	}
	missing := map[string]bool{}
	d.Rows, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (dlRow, error) {
		var x dlRow
		err := row.Scan(&x.ID, &x.Group, &x.Topic, &x.Partition, &x.FirstOffset, &x.LastOffset, &x.Hosts, &x.Types, &x.Events,
			&x.Error, &x.Attempts, &x.LastFailed, &x.ParkHosts, &x.Parked)
		x.CanResolve = c.resolver(x.Group, x.Topic) != nil
		if !x.CanResolve && !missing[x.Group] {
			missing[x.Group] = true
			d.Missing = append(d.Missing, x.Group)
		}
		return x, err
	})
	if err != nil {
		return "", "", nil, fmt.Errorf("console: dead letters: %w", err)
	}
	rows, err = c.pool.Query(ctx, schema.SQL(ctx, groupsWithDeadLettersSQL))
	if err != nil {
		return "", "", nil, fmt.Errorf("console: dead letters: %w", err)
	}
	if d.Groups, err = pgx.CollectRows(rows, pgx.RowToStructByPos[groupRef]); err != nil {
		return "", "", nil, fmt.Errorf("console: dead letters: %w", err)
	}
	if d.Audit, err = c.audit(ctx, "", 0, true, 20); err != nil {
		return "", "", nil, err
	}
	return "deadletters", "Dead letters", d, nil
}

// resolver returns the console's Resolver of the group, or nil.
func (c *Console) resolver(group string, topic int) Resolver {
	if c.opts.Resolvers == nil {
		return nil
	}
	return c.opts.Resolvers(group, topic)
}

// deadLetterData is a dead letter's page.
type deadLetterData struct {
	DL         pgevents.DeadLetter
	Parked     []pgevents.Event
	CanResolve bool
	Done       string
}

func (c *Console) deadLetterPage(r *http.Request) (string, string, any, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return "", "", nil, notFound("no dead letter %q", r.PathValue("id"))
	}
	ctx, cancel := c.queryContext(r)
	defer cancel()
	d := deadLetterData{Done: flash(r.URL.Query())}
	if d.DL, err = pgevents.GetDeadLetter(ctx, c.pool, id); errors.Is(err, pgevents.ErrNoDeadLetter) {
		return "", "", nil, notFound("dead letter %d does not exist (any more: replayed or discarded?)", id)
	} else if err != nil {
		return "", "", nil, err
	}
	if d.Parked, err = pgevents.ParkedEvents(ctx, c.pool, id); err != nil {
		return "", "", nil, err
	}
	d.CanResolve = c.resolver(d.DL.Group, d.DL.Topic) != nil
	return "deadletter", fmt.Sprintf("Dead letter %d", id), d, nil
}

func (c *Console) replay(w http.ResponseWriter, r *http.Request, a *actor) {
	c.resolve(w, r, a, "replay")
}

func (c *Console) discard(w http.ResponseWriter, r *http.Request, a *actor) {
	c.resolve(w, r, a, "discard")
}

// dlResult is what a replay or discard did to one dead letter.
type dlResult struct {
	ID      int64  `json:"id"`
	Handled int    `json:"handled"`
	Outcome string `json:"outcome"`
}

// resolve replays or discards the dead letters of the form's id fields,
// in the order given, each with its group's Resolver (in a transaction
// of its own), and records each in console_audit with its outcome.
func (c *Console) resolve(w http.ResponseWriter, r *http.Request, a *actor, action string) {
	_ = r.ParseForm()
	var ids []int64
	for _, v := range r.PostForm["id"] {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("id %q is not a dead letter id", v))
			return
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		c.fail(w, r, http.StatusBadRequest, "choose at least one dead letter")
		return
	}
	ctx := c.actionContext(r)
	var results []dlResult
	failed := 0
	for _, id := range ids {
		n, e, err := c.resolveOne(ctx, a, action, id)
		res := dlResult{ID: id, Handled: n, Outcome: e.Outcome}
		if err != nil {
			failed++
		}
		results = append(results, res)
	}
	if a.bearer || wantsJSON(r) {
		status := http.StatusOK
		if failed > 0 {
			status = http.StatusConflict
		}
		writeJSON(w, status, map[string]any{"action": action, "results": results})
		return
	}
	back := localPath(r.PostFormValue("back"), "/dead-letters")
	if len(ids) == 1 && failed == 0 && strings.HasPrefix(back, "/dead-letters/") {
		back = "/dead-letters" // the dead letter is gone
	}
	http.Redirect(w, r, back+doneQuery(action, len(ids)-failed, failed), http.StatusSeeOther)
}

// resolveOne replays or discards dead letter id and records it.
func (c *Console) resolveOne(ctx context.Context, a *actor, action string, id int64) (int, auditEntry, error) {
	e := auditEntry{Action: action, DeadLetter: &id}
	n, err := func() (int, error) {
		d, err := pgevents.GetDeadLetter(ctx, c.pool, id)
		if err != nil {
			return 0, err
		}
		e.Topic, e.Group, e.Partition = ptr(int32(d.Topic)), &d.Group, ptr(int32(d.Partition))
		e.Detail = fmt.Sprintf("offsets %d-%d, %d events, hosts %s", d.FirstOffset, d.LastOffset, len(d.EventIDs), strings.Join(d.HostIDs, " "))
		res := c.resolver(d.Group, d.Topic)
		if res == nil {
			return 0, fmt.Errorf("this console has no handlers for group %q on topic %d: %s it from a console (or consumer) configured with the group",
				d.Group, d.Topic, action)
		}
		if action == "replay" {
			return res.ReplayDeadLetter(ctx, id)
		}
		return res.DiscardDeadLetter(ctx, id)
	}()
	if err != nil {
		e.Outcome = "failed: " + c.redact(err.Error())
	} else {
		e.Outcome = fmt.Sprintf("ok: %d events handled", n)
	}
	c.logAction(a, e, err)
	if rerr := c.record(ctx, c.pool, a, e); rerr != nil {
		c.log.Error().Err(rerr).Msg("audit")
	}
	return n, e, err
}
