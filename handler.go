package pgevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Handler handles events of a consumer group.
//
// Handle runs inside the consumer's transaction: every statement it runs on
// tx commits together with the group's offset, exactly once, or not at all.
// It must not commit or roll back tx (both return ErrTxManaged); tx.Begin
// opens a savepoint. An error rolls the whole batch back; how it is retried
// or dead-lettered is decided by [Classify]. A handler whose effect
// completes outside the transaction after it returns uses the batch hook
// (see [Batch]).
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, ev *Event) error
}

// HandlerFunc adapts a function to the Handler interface.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, ev *Event) error

// Handle calls f(ctx, tx, ev).
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, ev *Event) error { return f(ctx, tx, ev) }

// JSONHandler returns a Handler that decodes each event's payload into a T
// and calls fn with it. A payload that does not decode is a permanent
// failure: the event's unit is dead-lettered with the decoding error.
func JSONHandler[T any](fn func(ctx context.Context, tx pgx.Tx, ev *Event, payload T) error) Handler {
	return HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		var v T
		if err := json.Unmarshal(ev.Payload, &v); err != nil {
			return Permanent(fmt.Errorf("decode payload of %s event %d: %w", ev.EventType, ev.Offset, err))
		}
		return fn(ctx, tx, ev, v)
	})
}

// GroupHandler handles runs of events: the consecutive events of one
// (host_id, user_id) inside one producer transaction's unit, in offset order,
// at once, for bulk work (per-user batching). Like Handler
// it runs in the consumer's transaction. A run of a producer transaction
// larger than the batch size may arrive in several calls, each in order, in
// the same transaction.
type GroupHandler interface {
	HandleGroup(ctx context.Context, tx pgx.Tx, run []Event) error
}

// GroupHandlerFunc adapts a function to the GroupHandler interface.
type GroupHandlerFunc func(ctx context.Context, tx pgx.Tx, run []Event) error

// HandleGroup calls f(ctx, tx, run).
func (f GroupHandlerFunc) HandleGroup(ctx context.Context, tx pgx.Tx, run []Event) error {
	return f(ctx, tx, run)
}

// Handlers maps event types to handlers. The zero value is empty and ready
// to use; register everything before the consumer starts.
//
// A handler is registered for an event type pattern: an event type
// ("user.created"), a prefix pattern ending in ".*" ("user.*" matches
// "user.created" and "user.admin.added", not "user"), or "*" for every
// type. An event goes to the handler of its exact type, else to the
// longest prefix pattern that matches it, else to the "*" handler; an
// event none of them matches is an unknown event type
// (Config.UnknownEventType). Two handlers for one pattern, or a pattern
// that is not valid (see [ValidEventPattern]), make NewConsumer fail.
type Handlers struct {
	exact    map[string]Handler
	prefixes map[string]Handler // by the prefix: "user." for "user.*"
	catchAll Handler
	groups   GroupHandler
	refused  string // why the first refused registration was refused
}

// ValidEventPattern reports whether pattern can be registered in
// [Handlers]: an event type without "*", a prefix pattern whose only "*"
// is its whole last segment ("user.*"), or "*" alone. It returns nil or
// an error saying what is wrong.
func ValidEventPattern(pattern string) error {
	switch n := strings.Count(pattern, "*"); {
	case pattern == "":
		return errors.New(`an event type or pattern is required: an event type, a prefix pattern such as "user.*", or "*" for every type`)
	case n == 0, pattern == "*", n == 1 && strings.HasSuffix(pattern, ".*"):
		return nil
	}
	return fmt.Errorf(`%q is not an event type or pattern: a "*" stands only for a whole last segment, as in "user.*", or alone, "*" for every type`, pattern)
}

// HandleGroups registers h to receive every event as runs (see
// GroupHandler). When set, it replaces the per-event handlers. A second
// group handler makes NewConsumer fail.
func (hs *Handlers) HandleGroups(h GroupHandler) {
	if hs.groups != nil {
		hs.refuse("registers two group handlers")
		return
	}
	hs.groups = h
}

// Handle registers h for the events that pattern matches: an event type,
// a prefix pattern such as "user.*", or "*" (see [Handlers] for the
// precedence). A pattern registered before, or one that is not valid,
// is refused: NewConsumer then fails, naming it.
func (hs *Handlers) Handle(pattern string, h Handler) {
	if err := ValidEventPattern(pattern); err != nil {
		hs.refuse("registers a handler for an invalid pattern: " + err.Error())
		return
	}
	var byPattern map[string]Handler
	key := pattern
	switch {
	case pattern == "*":
		if hs.catchAll != nil {
			hs.refuse(`registers two handlers for every event type ("*")`)
			return
		}
		hs.catchAll = h
		return
	case strings.HasSuffix(pattern, ".*"):
		if hs.prefixes == nil {
			hs.prefixes = map[string]Handler{}
		}
		byPattern, key = hs.prefixes, strings.TrimSuffix(pattern, "*")
	default:
		if hs.exact == nil {
			hs.exact = map[string]Handler{}
		}
		byPattern = hs.exact
	}
	if _, dup := byPattern[key]; dup {
		hs.refuse(fmt.Sprintf("registers two handlers for event type %q", pattern))
		return
	}
	byPattern[key] = h
}

// HandleFunc registers fn for the events that pattern matches, as Handle.
func (hs *Handlers) HandleFunc(pattern string, fn func(ctx context.Context, tx pgx.Tx, ev *Event) error) {
	hs.Handle(pattern, HandlerFunc(fn))
}

// HandleAll registers h for every event type that has no handler of its
// own: it is Handle("*", h).
func (hs *Handlers) HandleAll(h Handler) { hs.Handle("*", h) }

// refuse records a registration that was refused, the first one only:
// NewConsumer reports it.
func (hs *Handlers) refuse(msg string) {
	if hs.refused == "" {
		hs.refused = msg
	}
}

// Lookup returns the handler of an event of type eventType and whether
// there is one: the handler of eventType itself, else of the longest
// prefix pattern that matches it, else of "*".
func (hs *Handlers) Lookup(eventType string) (Handler, bool) {
	if h, ok := hs.exact[eventType]; ok {
		return h, true
	}
	if len(hs.prefixes) > 0 {
		// Each prefix of eventType that ends in a dot, longest first.
		for i := strings.LastIndexByte(eventType, '.'); i >= 0; i = strings.LastIndexByte(eventType[:i], '.') {
			if h, ok := hs.prefixes[eventType[:i+1]]; ok {
				return h, true
			}
		}
	}
	return hs.catchAll, hs.catchAll != nil
}

// Len returns the number of registered handlers, the catch-all included.
func (hs *Handlers) Len() int {
	n := len(hs.exact) + len(hs.prefixes)
	if hs.catchAll != nil {
		n++
	}
	if hs.groups != nil {
		n++
	}
	return n
}

// ErrTxManaged is returned by Commit and Rollback on the transaction given
// to a handler: the consumer commits it, with the group's offset.
var ErrTxManaged = errors.New("pgevents: the consumer transaction is managed by the consumer")

// handlerTx is the consumer's transaction as handlers see it.
type handlerTx struct {
	pgx.Tx
	epoch int64 // the partition lease's epoch, the fencing token
}

// Epoch returns the fencing token of the transaction a handler was given:
// the epoch of the partition lease under which the batch runs. It grows
// each time the partition changes owner, so a system outside PostgreSQL
// that remembers the highest epoch it has seen per partition can refuse
// writes from a replica that lost the partition (frozen, then resumed). It
// returns 0 for a transaction that is not a consumer's.
func Epoch(tx pgx.Tx) int64 {
	if h, ok := tx.(handlerTx); ok {
		return h.epoch
	}
	return 0
}

// ErrAbortedTransaction is the permanent failure of a handler that returned
// nil although its transaction is aborted: it ignored a SQL error (a common
// "ignore the duplicate key" mistake), so nothing after it could commit.
// The handler's unit is dead-lettered with this reason. To recover from a
// SQL error inside a handler, run the statement in a savepoint (tx.Begin)
// and roll back to it.
var ErrAbortedTransaction = errors.New("handler returned nil on an aborted transaction")

// check returns the failure of a handler that returned nil for ev on an
// aborted transaction. The transaction status is the one the server sent
// with its last ReadyForQuery, so checking costs no round trip.
func (tx handlerTx) check(ev *Event) error {
	if tx.Conn().PgConn().TxStatus() != 'E' {
		return nil
	}
	return fmt.Errorf("%w: the handler of event %d (%s) ignored a SQL error; "+
		"run statements that may fail in a savepoint (tx.Begin) and roll back to it", ErrAbortedTransaction, ev.Offset, ev.EventType)
}

func (handlerTx) Commit(context.Context) error   { return ErrTxManaged }
func (handlerTx) Rollback(context.Context) error { return ErrTxManaged }
