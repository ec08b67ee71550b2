package console

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/schema"
)

const (
	// auditListSQL reads the newest $4 actions, of group $1 on topic $2
	// ('' and 0: any), or on dead letters only when $3, whatever their
	// origin (the console's, the CLI's: offsets.Audit writes them all).
	auditListSQL = `SELECT id, at, origin, actor, remote, action, topic_id, group_id, partition_id, dead_letter_id, detail, outcome
FROM {schema}console_audit
WHERE ($1::text = '' OR group_id = $1) AND ($2::integer = 0 OR topic_id = $2)
  AND (NOT $3::boolean OR dead_letter_id IS NOT NULL)
ORDER BY id DESC
LIMIT $4`
)

// auditEntry is an action to record, or a row of console_audit.
type auditEntry struct {
	ID         int64
	At         time.Time
	Origin     string // offsets.OriginConsole or offsets.OriginCLI
	Actor      string
	Remote     string
	Action     string
	Topic      *int32
	Group      *string
	Partition  *int32
	DeadLetter *int64
	Detail     string
	Outcome    string
}

// record writes e, taken by a, with q (the action's transaction, or the
// pool) through offsets.Audit, the audit's one writer; ctx names the
// schema.
func (c *Console) record(ctx context.Context, q schema.DB, a *actor, e auditEntry) error {
	return offsets.Audit(ctx, q, offsets.AuditEntry{Origin: offsets.OriginConsole, Actor: a.name, Remote: a.remote,
		Action: e.Action, Topic: widen(e.Topic), Group: e.Group, Partition: widen(e.Partition), DeadLetter: e.DeadLetter,
		Detail: e.Detail, Outcome: e.Outcome})
}

// widen returns *p as an int.
func widen(p *int32) *int {
	if p == nil {
		return nil
	}
	return ptr(int(*p))
}

// logAction writes the log line of an action.
func (c *Console) logAction(a *actor, e auditEntry, err error) {
	ev := c.log.Info()
	if err != nil {
		ev = c.log.Warn().Str("error", c.redact(err.Error()))
	}
	if e.Topic != nil {
		ev = ev.Int32("topic", *e.Topic)
	}
	if e.Group != nil {
		ev = ev.Str("group", *e.Group)
	}
	if e.Partition != nil {
		ev = ev.Int32("partition", *e.Partition)
	}
	if e.DeadLetter != nil {
		ev = ev.Int64("dead_letter", *e.DeadLetter)
	}
	ev.Str("actor", a.name).Str("remote", a.remote).Str("action", e.Action).Str("detail", e.Detail).
		Str("outcome", e.Outcome).Msg("console action")
}

// audit reads the newest actions (see auditListSQL).
func (c *Console) audit(ctx context.Context, group string, topic int, deadLetters bool, limit int) ([]auditEntry, error) {
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, auditListSQL), group, topic, deadLetters, limit)
	if err != nil {
		return nil, fmt.Errorf("console: audit: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (auditEntry, error) {
		var e auditEntry
		err := row.Scan(&e.ID, &e.At, &e.Origin, &e.Actor, &e.Remote, &e.Action, &e.Topic, &e.Group, &e.Partition, &e.DeadLetter, &e.Detail, &e.Outcome)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("console: audit: %w", err)
	}
	return out, nil
}

// auditData is the audit page's.
type auditData struct {
	Group   string
	Topic   int
	Entries []auditEntry
}

func (c *Console) auditPage(r *http.Request) (string, string, any, error) {
	ctx, cancel := c.queryContext(r)
	defer cancel()
	d := auditData{Group: r.URL.Query().Get("group")}
	if t := r.URL.Query().Get("topic"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil {
			return "", "", nil, badRequest("topic %q is not a number", t)
		}
		d.Topic = n
	}
	var err error
	if d.Entries, err = c.audit(ctx, d.Group, d.Topic, false, 500); err != nil {
		return "", "", nil, err
	}
	return "audit", "Audit", d, nil
}

func ptr[T any](v T) *T { return &v }
