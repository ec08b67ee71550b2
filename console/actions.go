package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/schema"
)

// The actions. Each runs only behind Console.action (the token, the CSRF
// token, not read-only), writes a row of console_audit and a log line,
// and answers a browser with a redirect to the page it came from, a
// script with JSON.

// actionContext is the request's context, naming the schema.
func (c *Console) actionContext(r *http.Request) context.Context {
	return schema.WithName(r.Context(), c.opts.Schema)
}

// groupTarget reads the topic and group of an action's path.
func groupTarget(r *http.Request) (int, string, error) {
	topic, err := pathInt(r, "topic")
	return topic, r.PathValue("group"), err
}

func (c *Console) pause(w http.ResponseWriter, r *http.Request, a *actor) {
	c.setState(w, r, a, "pause", offsets.Paused)
}

func (c *Console) resume(w http.ResponseWriter, r *http.Request, a *actor) {
	c.setState(w, r, a, "resume", offsets.Active)
}

// setState moves the group's subscription to state (offsets.SetState),
// with its audit row in the same transaction.
func (c *Console) setState(w http.ResponseWriter, r *http.Request, a *actor, action, state string) {
	topic, group, err := groupTarget(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	ctx := c.actionContext(r)
	e := auditEntry{Action: action, Topic: ptr(int32(topic)), Group: &group}
	err = c.inTx(ctx, func(tx pgx.Tx) error {
		prev, err := offsets.SetState(ctx, tx, group, topic, state)
		if err != nil {
			return err
		}
		e.Detail, e.Outcome = transition(prev, state), "ok"
		return c.record(ctx, tx, a, e)
	})
	c.finish(w, r, a, e, err, groupPath(topic, group), http.StatusConflict)
}

// transition describes a move from state prev to state to: "PAUSED ->
// ACTIVE", or "already PAUSED" when the group was in it (offsets.SetState
// then changed nothing).
func transition(prev, to string) string {
	if prev == to {
		return "already " + to
	}
	return prev + " -> " + to
}

func (c *Console) unhalt(w http.ResponseWriter, r *http.Request, a *actor) {
	topic, group, err := groupTarget(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	partition, err := strconv.Atoi(r.PostFormValue("partition"))
	if err != nil || partition < 0 {
		c.fail(w, r, http.StatusBadRequest, "partition: a partition number is required")
		return
	}
	ctx := c.actionContext(r)
	e := auditEntry{Action: "unhalt", Topic: ptr(int32(topic)), Group: &group, Partition: ptr(int32(partition))}
	err = c.inTx(ctx, func(tx pgx.Tx) error {
		h, ok, err := offsets.Unhalt(ctx, tx, group, topic, partition)
		if err != nil {
			return err
		}
		if !ok {
			return errNotHalted
		}
		e.Detail, e.Outcome = fmt.Sprintf("halted at offset %d: %s", h.Offset, h.Reason), "ok"
		return c.record(ctx, tx, a, e)
	})
	c.finish(w, r, a, e, err, groupPath(topic, group), http.StatusConflict)
}

var errNotHalted = errors.New("the partition is not halted")

// finish ends an action: on failure the audit row of the attempt (outside
// the action's transaction, which rolled back) and the error with status;
// on success a redirect to back with the code of what was done (see
// flashes). Both are logged.
func (c *Console) finish(w http.ResponseWriter, r *http.Request, a *actor, e auditEntry, err error, back string, status int) {
	if err != nil {
		e.Outcome = "failed: " + c.redact(err.Error())
		c.logAction(a, e, err)
		if rerr := c.record(c.actionContext(r), c.pool, a, e); rerr != nil {
			c.log.Error().Err(rerr).Msg("audit of a failed action")
		}
		c.fail(w, r, status, e.Outcome)
		return
	}
	c.logAction(a, e, nil)
	if a.bearer || wantsJSON(r) {
		writeJSON(w, http.StatusOK, map[string]any{"action": e.Action, "detail": e.Detail, "outcome": e.Outcome})
		return
	}
	http.Redirect(w, r, back+doneQuery(e.Action, 1, 0), http.StatusSeeOther)
}

func groupPath(topic int, group string) string {
	return "/topics/" + strconv.Itoa(topic) + "/groups/" + url.PathEscape(group)
}

// localPath returns p when it is a plain absolute path of this console,
// else def: the page an action goes back to is never another site. A
// path starts with a single "/" and holds only printable ASCII other than
// a space, without "//" anywhere, a backslash, a query or a fragment
// (browsers drop a TAB, CR or LF from a URL and read "\" as "/", either
// of which can make "/\t/evil.example" the protocol-relative
// "//evil.example").
func localPath(p, def string) string {
	if !strings.HasPrefix(p, "/") || strings.Contains(p, "//") {
		return def
	}
	for i := 0; i < len(p); i++ {
		if b := p[i]; b <= ' ' || b >= 0x7f || b == '\\' || b == '?' || b == '#' {
			return def
		}
	}
	return p
}

// inTx runs f in a transaction and commits it when f returns nil.
func (c *Console) inTx(ctx context.Context, f func(tx pgx.Tx) error) error {
	tx, err := c.pool.BeginTx(ctx, offsets.TxOptions())
	if err != nil {
		return fmt.Errorf("console: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if err := f(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("console: commit: %w", err)
	}
	return nil
}
