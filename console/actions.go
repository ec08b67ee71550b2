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
		halts, err := offsets.Halts(ctx, tx, group, topic)
		if err != nil {
			return err
		}
		for _, h := range halts {
			if h.Partition == partition {
				if err := offsets.Unhalt(ctx, tx, group, topic, partition); err != nil {
					return err
				}
				e.Detail, e.Outcome = fmt.Sprintf("halted at offset %d: %s", h.Offset, h.Reason), "ok"
				return c.record(ctx, tx, a, e)
			}
		}
		return errNotHalted
	})
	c.finish(w, r, a, e, err, groupPath(topic, group), http.StatusConflict)
}

var errNotHalted = errors.New("the partition is not halted")

// finish ends an action: on failure the audit row of the attempt (outside
// the action's transaction, which rolled back) and the error with status;
// on success a redirect to back with what was done. Both are logged.
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
	done := e.Action + ": " + e.Detail
	if a.bearer || wantsJSON(r) {
		writeJSON(w, http.StatusOK, map[string]any{"action": e.Action, "detail": e.Detail, "outcome": e.Outcome})
		return
	}
	http.Redirect(w, r, back+"?done="+url.QueryEscape(done), http.StatusSeeOther)
}

func groupPath(topic int, group string) string {
	return "/topics/" + strconv.Itoa(topic) + "/groups/" + url.PathEscape(group)
}

// localPath returns p when it is a path of this console, else def: the
// page an action goes back to is never another site.
func localPath(p, def string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\\r\n") {
		return def
	}
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	return p
}

// inTx runs f in a transaction and commits it when f returns nil.
func (c *Console) inTx(ctx context.Context, f func(tx pgx.Tx) error) error {
	tx, err := c.pool.Begin(ctx)
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
