package pgevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/pgeventstype"
	"github.com/pgevents/pgevents/schema"
)

// Event is one event of the log. Append reads TopicID, HostID, UserID,
// EventType, Payload, Metadata and IdempotencyKey; the database sets the
// other fields, and a handler receives them all but IdempotencyKey.
type Event = pgeventstype.Event

// DefaultTopic is the topic an event is appended to when its TopicID is 0.
const DefaultTopic = 1

// Querier is schema.DB, the database handle every function of pgevents
// takes: pgx.Tx, *pgx.Conn, *pgxpool.Conn and *pgxpool.Pool satisfy it.
//
// Deprecated: name schema.DB. Querier stays so that code naming it
// compiles; a type of its own that implements only Exec, Query and
// QueryRow needs SendBatch and Begin too.
type Querier = schema.DB

// ErrInvalidEvent is wrapped by Append's error when an event lacks HostID or
// EventType, or carries a payload that is not JSON.
var ErrInvalidEvent = errors.New("invalid event")

// topicNotFoundError is Append's error for a topic that does not exist:
// the server's (SQLSTATE 23503, raised by the append functions) with the
// hint the SQL path prints beside it, wrapping schema.ErrTopicNotFound so
// that Classify calls it a failure of the deployment, not of the event.
type topicNotFoundError struct {
	err  error
	hint string
}

func (e *topicNotFoundError) Error() string { return "append: " + e.err.Error() + "; " + e.hint }

func (e *topicNotFoundError) Unwrap() []error { return []error{e.err, schema.ErrTopicNotFound} }

// appendError returns err, the failure of a statement that appends
// events, prefixed with "append: " (the exported functions add the
// package's prefix): as a *topicNotFoundError when the
// append functions said that the topic does not exist.
func appendError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" &&
		strings.HasPrefix(pgErr.Message, "pgevents: topic ") && strings.HasSuffix(pgErr.Message, " does not exist") {
		hint := pgErr.Hint
		if hint == "" || !strings.Contains(hint, "migrate") {
			hint = "create it with: consumer migrate --config FILE"
		}
		return &topicNotFoundError{err: err, hint: hint}
	}
	return fmt.Errorf("append: %w", err)
}

type appendItem struct {
	HostID         string          `json:"host_id"`
	UserID         string          `json:"user_id,omitempty"`
	EventType      string          `json:"event_type"`
	Payload        json.RawMessage `json:"payload,omitempty"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
}

// AppendResult is what an append did with one event.
type AppendResult struct {
	// Offset is the event's offset, or, for a duplicate, the offset its
	// idempotency key was appended at.
	Offset int64
	// Partition is the event's partition, or the duplicate's original's.
	Partition int
	// Duplicate says that the event carried an idempotency key appended to
	// its topic before, within the topic's idempotency window: nothing was
	// appended. Offset and Partition are the first append's. (When
	// retention has removed that event since, they name an event the log
	// no longer holds.)
	Duplicate bool
	// Sequenced says that the topic is sequenced (offset scope
	// "sequenced"): the event was staged, its offset and partition are
	// assigned by the topic's sequencer after the transaction commits.
	// Offset is then the event's sequence number (ascending in the order
	// of the appends, across the database), and Partition is -1.
	Sequenced bool
}

// WithSchema returns a context under which Append, AppendCommit and every
// other function of pgevents name pgevents' objects in schema name, where
// `consumer migrate` installed them with the configuration key schema:
// producers whose search_path does not include that schema append with
// it. "" (or a context without it) means the first schema of the
// search_path. name must be a lowercase identifier (schema.ValidName).
func WithSchema(ctx context.Context, name string) context.Context {
	return schema.WithName(ctx, name)
}

// Append appends events in q's transaction and returns their offsets, in the
// order given. Events of one topic take one round trip and receive
// consecutive offsets (consecutive per partition under offset scope
// 'partition'); events of several topics are appended topic by topic in
// ascending topic order (a fixed order, so that producers cannot deadlock on
// the topics' append locks), one round trip each.
//
// The topic's append lock (an advisory lock: the topic's, or its
// partitions' under offset scope 'partition') stays held until q's
// transaction ends:
// append as late in the transaction as possible, or use AppendCommit. Given
// a pool, Append runs in a transaction of its own, the fastest way to
// append: the lock is held for the server's work and the commit only.
// Append checks HostID, EventType and that Payload and Metadata are valid
// JSON before any round trip.
//
// Under offset scope 'partition', one call locks the partitions its events
// fall in, in ascending partition order, so transactions that each append
// to a topic with one call cannot deadlock on each other. A transaction
// that calls Append more than once for a topic locks partitions in the
// order of its calls, and two such transactions can deadlock: one appends
// for a host of partition 1, then for one of partition 2, while the other
// appends for partition 2, then 1. PostgreSQL then ends one of them with
// SQLSTATE 40P01 (deadlock_detected), after deadlock_timeout (1 s by
// default): its Append returns an error wrapping a *pgconn.PgError with
// Code "40P01" ("append: ERROR: deadlock detected (SQLSTATE 40P01)"),
// which Classify classes ClassTransient, and its transaction is aborted.
// Append all of a transaction's events of a topic in one call; otherwise
// roll back and run the whole transaction again on 40P01.
//
// When ctx carries a valid OpenTelemetry span, Append records its W3C
// trace context in each event's metadata (keys traceparent and tracestate,
// beside the event's own; an event whose metadata has a traceparent keeps
// it), and a consumer that traces links its spans to it. Metadata that is
// not a JSON object is left as it is.
//
// An event with an IdempotencyKey is appended once per key and topic within
// the topic's idempotency window: a second append of the key appends
// nothing, and Append returns the first one's offset. AppendResults says
// which were duplicates.
//
// To a sequenced topic (offset scope "sequenced"), Append stages the
// events: it takes no lock, waits for nothing, and returns their sequence
// numbers, not offsets; the topic's sequencer gives them offsets once the
// transaction committed (see AppendResult.Sequenced). The rules above on
// locks and deadlocks do not apply, nor does the isolation level matter.
//
// To a topic that does not exist, Append returns an error wrapping
// schema.ErrTopicNotFound and the server's *pgconn.PgError (SQLSTATE
// 23503), whose text says to create the topic with `consumer migrate`;
// Classify calls it ClassDeployment, so a handler that appends to a topic
// not created yet is retried, never dead-lettered.
func Append(ctx context.Context, q schema.DB, events ...Event) ([]int64, error) {
	res, err := appendEvents(ctx, q, false, events)
	return offsetsOf(res), prefixed(err)
}

// AppendResults is Append returning, for each event, its offset, its
// partition and whether it was a duplicate of an event appended before with
// its IdempotencyKey. It reads the partitions back, which costs a little
// more per call than Append.
func AppendResults(ctx context.Context, q schema.DB, events ...Event) ([]AppendResult, error) {
	res, err := appendEvents(ctx, q, true, events)
	return res, prefixed(err)
}

// appendEvents appends events in q's transaction, one statement per topic;
// all of them with append_events_keyed when results are wanted (the
// partitions come back only from it), else only the topics whose events
// carry an idempotency key.
func appendEvents(ctx context.Context, q schema.DB, results bool, events []Event) ([]AppendResult, error) {
	stmts, err := planAppend(ctx, events, results)
	if err != nil {
		return nil, err
	}
	out := make([]AppendResult, len(events))
	for i := range stmts {
		if err := stmts[i].scan(q.QueryRow(ctx, schema.SQL(ctx, stmts[i].sql), stmts[i].args...), out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// offsetsOf returns the offsets of res.
func offsetsOf(res []AppendResult) []int64 {
	if res == nil {
		return nil
	}
	out := make([]int64, len(res))
	for i, r := range res {
		out[i] = r.Offset
	}
	return out
}

// AppendCommit appends events as the last statements of tx and commits tx,
// in one round trip: the append lock is then held for the server's work and
// the commit's WAL flush only, not for one more round trip of the network
// (the fast path for producers whose append is the last thing they do). It
// returns the offsets. Whatever the outcome, the transaction is finished
// when AppendCommit returns: committed, or rolled back on error. tx itself
// does not know it: call tx.Rollback afterwards, as a deferred Rollback
// does, to release a pooled connection; PostgreSQL answers it "no
// transaction in progress", a warning, and it holds no lock. To save that
// round trip, begin tx on a connection of your own (pool.Acquire, then
// conn.Begin) and release the connection once AppendCommit returned: the
// pool takes it back as it is idle, or closes it if it is not.
//
// AppendCommit appends with one call, which under offset scope 'partition'
// locks the partitions in ascending order, as Append does. After an earlier
// Append for the same topic in tx it can deadlock with another transaction
// (see Append): it then returns an error wrapping a *pgconn.PgError with
// Code "40P01" (ClassTransient), with tx rolled back; run the transaction
// again.
func AppendCommit(ctx context.Context, tx pgx.Tx, events ...Event) ([]int64, error) {
	res, err := appendCommit(ctx, tx, false, events)
	return offsetsOf(res), prefixed(err)
}

// AppendCommitResults is AppendCommit returning what AppendResults does.
func AppendCommitResults(ctx context.Context, tx pgx.Tx, events ...Event) ([]AppendResult, error) {
	res, err := appendCommit(ctx, tx, true, events)
	return res, prefixed(err)
}

func appendCommit(ctx context.Context, tx pgx.Tx, results bool, events []Event) ([]AppendResult, error) {
	stmts, err := planAppend(ctx, events, results)
	if err != nil {
		return nil, err
	}
	var b pgx.Batch
	for i := range stmts {
		b.Queue(schema.SQL(ctx, stmts[i].sql), stmts[i].args...)
	}
	b.Queue("COMMIT")
	br := tx.SendBatch(ctx, &b)
	out := make([]AppendResult, len(events))
	fail := func(err error) ([]AppendResult, error) {
		_ = br.Close()
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	for i := range stmts {
		if err := stmts[i].scan(br.QueryRow(), out); err != nil {
			return fail(err)
		}
	}
	if _, err := br.Exec(); err != nil {
		return fail(fmt.Errorf("append: commit: %w", err))
	}
	if err := br.Close(); err != nil {
		return fail(fmt.Errorf("append: commit: %w", err))
	}
	return out, nil
}

// appendStmt is the statement that appends the events of one topic.
type appendStmt struct {
	topic int
	idx   []int // the events' indexes in Append's arguments
	keyed bool  // append_events_keyed: partitions and duplicates come back
	sql   string
	args  []any
}

// scan reads the statement's results into out, at the events' indexes.
func (s *appendStmt) scan(row pgx.Row, out []AppendResult) error {
	if s.keyed {
		var offs []int64
		var parts []int32
		var dups []bool
		if err := row.Scan(&offs, &parts, &dups); err != nil {
			return appendError(err)
		}
		if len(offs) != len(s.idx) || len(parts) != len(s.idx) || len(dups) != len(s.idx) {
			return fmt.Errorf("append: topic %d: %d results for %d events", s.topic, len(offs), len(s.idx))
		}
		for k, i := range s.idx {
			out[i] = AppendResult{Offset: offs[k], Partition: int(parts[k]), Duplicate: dups[k], Sequenced: parts[k] < 0}
		}
		return nil
	}
	if len(s.idx) == 1 {
		var off int64
		if err := row.Scan(&off); err != nil {
			return appendError(err)
		}
		out[s.idx[0]].Offset = off
		return nil
	}
	var offs []int64
	if err := row.Scan(&offs); err != nil {
		return appendError(err)
	}
	if len(offs) != len(s.idx) {
		return fmt.Errorf("append: topic %d: appended %d events, expected %d", s.topic, len(offs), len(s.idx))
	}
	for k, i := range s.idx {
		out[i].Offset = offs[k]
	}
	return nil
}

// planAppend checks events and returns the statements that append them:
// one per topic, in ascending topic order; append_events_keyed when results
// are wanted or an event of the topic carries an idempotency key, else
// append_event for a single event and append_events with a JSON array
// otherwise.
func planAppend(ctx context.Context, events []Event, results bool) ([]appendStmt, error) {
	if len(events) == 0 {
		return nil, nil
	}
	// The producer's span, recorded in each event's metadata (tracing.go).
	sc := trace.SpanContextFromContext(ctx)
	metadata := func(ev *Event) json.RawMessage {
		if !sc.IsValid() {
			return ev.Metadata
		}
		return withTraceContext(ev.Metadata, sc)
	}
	byTopic := map[int][]int{}
	for i := range events {
		ev := &events[i]
		if ev.HostID == "" {
			return nil, fmt.Errorf("append: event %d: host_id is required: %w", i, ErrInvalidEvent)
		}
		if ev.EventType == "" {
			return nil, fmt.Errorf("append: event %d: event_type is required: %w", i, ErrInvalidEvent)
		}
		if len(ev.Payload) > 0 && !json.Valid(ev.Payload) {
			return nil, fmt.Errorf("append: event %d: payload is not JSON: %w", i, ErrInvalidEvent)
		}
		if len(ev.Metadata) > 0 && !json.Valid(ev.Metadata) {
			return nil, fmt.Errorf("append: event %d: metadata is not JSON: %w", i, ErrInvalidEvent)
		}
		t := ev.TopicID
		if t == 0 {
			t = DefaultTopic
		}
		byTopic[t] = append(byTopic[t], i)
	}
	topics := make([]int, 0, len(byTopic))
	for t := range byTopic {
		topics = append(topics, t)
	}
	sort.Ints(topics)
	stmts := make([]appendStmt, 0, len(topics))
	for _, t := range topics {
		idx := byTopic[t]
		keyed := results
		for _, i := range idx {
			keyed = keyed || events[i].IdempotencyKey != ""
		}
		if len(idx) == 1 && !keyed {
			ev := &events[idx[0]]
			sql, args := store.AppendOneSQL(t, ev.HostID, ev.UserID, ev.EventType, ev.Payload, metadata(ev))
			stmts = append(stmts, appendStmt{topic: t, idx: idx, sql: sql, args: args})
			continue
		}
		items := make([]appendItem, 0, len(idx))
		for _, i := range idx {
			ev := &events[i]
			items = append(items, appendItem{HostID: ev.HostID, UserID: ev.UserID, EventType: ev.EventType, Payload: ev.Payload,
				Metadata: metadata(ev), IdempotencyKey: ev.IdempotencyKey})
		}
		body, err := json.Marshal(items)
		if err != nil {
			return nil, fmt.Errorf("append: encode: %w", err)
		}
		sql, args := store.AppendSQL(t, body)
		if keyed {
			sql, args = store.AppendKeyedSQL(t, body)
		}
		stmts = append(stmts, appendStmt{topic: t, idx: idx, keyed: keyed, sql: sql, args: args})
	}
	return stmts, nil
}
