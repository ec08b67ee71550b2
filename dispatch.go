package pgevents

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgevents/pgevents/batching"
)

// This file: dispatch, the handlers' calls for the events of a unit, in
// order, with panics and swallowed SQL errors turned into failures.

// dispatch runs the handlers of evs, a unit or the part of one in a chunk,
// in order on tx: the group handler on each run when one is registered,
// otherwise each event's handler. It counts the events handled in *handled
// and returns the event at which it failed, also when ctx ended while a
// handler that ignored it ran, or when a handler returned nil on a
// transaction that an error it swallowed had aborted.
func (c *Consumer) dispatch(ctx context.Context, tx handlerTx, evs []Event, handled *int) (*Event, error) {
	var failed *Event
	if gh := c.cfg.Handlers.groups; gh != nil {
		err := batching.EachRun(keys, evs, func(run []Event) error {
			err := c.callGroup(ctx, tx, gh, run)
			if err == nil {
				err = tx.check(&run[0])
			}
			if err != nil || ctx.Err() != nil {
				failed = &run[0]
				return errOr(err, ctx)
			}
			*handled += len(run)
			return nil
		})
		return failed, err
	}
	for i := range evs {
		ev := &evs[i]
		err := c.call(ctx, tx, ev)
		if err == nil {
			err = tx.check(ev)
		}
		if err != nil || ctx.Err() != nil {
			return ev, errOr(err, ctx)
		}
		*handled++
	}
	return nil, nil
}

// errOr returns err, or the cause of ctx's end when err is nil.
func errOr(err error, ctx context.Context) error {
	if err != nil {
		return err
	}
	return context.Cause(ctx)
}

// call runs the handler of ev, turning a panic into a PanicError.
func (c *Consumer) call(ctx context.Context, tx handlerTx, ev *Event) (err error) {
	h, ok := c.cfg.Handlers.Lookup(ev.EventType)
	if !ok {
		if c.cfg.UnknownEventType == UnknownEventSkip {
			return nil
		}
		return fmt.Errorf("%w %q", ErrUnknownEventType, ev.EventType)
	}
	if c.trace != nil {
		var span trace.Span
		ctx, span = c.trace.startHandler(ctx, ev, nil)
		defer func() { endHandler(span, err) }() // after recoverPanic set err
	}
	defer recoverPanic(&err)
	return h.Handle(ctx, tx, ev)
}

// callGroup runs a group handler on a run, turning a panic into a
// PanicError.
func (c *Consumer) callGroup(ctx context.Context, tx handlerTx, gh GroupHandler, run []Event) (err error) {
	if c.trace != nil {
		var span trace.Span
		ctx, span = c.trace.startHandler(ctx, &run[0], run)
		defer func() { endHandler(span, err) }()
	}
	defer recoverPanic(&err)
	return gh.HandleGroup(ctx, tx, run)
}

func recoverPanic(err *error) {
	if r := recover(); r != nil {
		*err = &PanicError{Value: r, Stack: debug.Stack()}
	}
}

// handlerTx is used as pgx.Tx.
var _ pgx.Tx = handlerTx{}
