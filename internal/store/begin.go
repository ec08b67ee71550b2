package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// ReadCommitted is the isolation of every transaction pgevents runs on the
// consumer's side (batches, leases, subscriptions, layouts, maintenance,
// the operator's commands and the console), whatever the session's
// default.
//
// Why: a batch locks the group's position in its partition and then reads
// the position, and the lease it claims under; an operator's reset or
// pause writes under the same locks. Under READ COMMITTED each statement
// reads in a snapshot of its own, taken after the locks before it were
// granted, so it sees what the lock's previous holder committed. Under
// REPEATABLE READ or SERIALIZABLE the snapshot is the transaction's first
// statement's, taken before the lock: a claim that waited for an
// operator's reset would read the position from before the reset, handle
// the events below it and write its own position over the operator's.
// pgevents.NewPoolConfig makes READ COMMITTED the default of a consumer's
// sessions, and every consumer-side transaction begins with this level
// too (Begin), so that a pool made otherwise is safe as well.
var ReadCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// txBeginner is what pools and connections have, and a pgx.Tx has not.
type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Begin begins a READ COMMITTED transaction on db (see ReadCommitted), or
// a savepoint when db is a transaction already, whose isolation is its
// own.
func Begin(ctx context.Context, db schema.DB) (pgx.Tx, error) {
	if b, ok := db.(txBeginner); ok {
		return b.BeginTx(ctx, ReadCommitted)
	}
	return db.Begin(ctx)
}
