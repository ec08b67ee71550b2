package pgevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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
// at once, for bulk work (the seed design's per-user batching). Like Handler
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
type Handlers struct {
	byType   map[string]Handler
	catchAll Handler
	groups   GroupHandler
}

// HandleGroups registers h to receive every event as runs (see
// GroupHandler). When set, it replaces the per-event handlers.
func (hs *Handlers) HandleGroups(h GroupHandler) { hs.groups = h }

// Handle registers h for events of type eventType, replacing any handler
// registered for it before.
func (hs *Handlers) Handle(eventType string, h Handler) {
	if hs.byType == nil {
		hs.byType = map[string]Handler{}
	}
	hs.byType[eventType] = h
}

// HandleFunc registers fn for events of type eventType.
func (hs *Handlers) HandleFunc(eventType string, fn func(ctx context.Context, tx pgx.Tx, ev *Event) error) {
	hs.Handle(eventType, HandlerFunc(fn))
}

// HandleAll registers h for every event type that has no handler of its own.
func (hs *Handlers) HandleAll(h Handler) { hs.catchAll = h }

// Lookup returns the handler for eventType and whether there is one.
func (hs *Handlers) Lookup(eventType string) (Handler, bool) {
	if h, ok := hs.byType[eventType]; ok {
		return h, true
	}
	return hs.catchAll, hs.catchAll != nil
}

// Len returns the number of registered handlers, the catch-all included.
func (hs *Handlers) Len() int {
	n := len(hs.byType)
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
