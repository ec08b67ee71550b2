package pgevents

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/schema"
)

// controlPatience is how long a statement of the consumer's own upkeep
// waits for the listener's session before it runs on a pool connection
// instead. The session is free within microseconds unless another upkeep
// statement holds it (one that waits for a lock, say).
const controlPatience = 50 * time.Millisecond

// control is the schema.DB of the consumer's upkeep: the lease heartbeat,
// the subscription's heartbeat and rechecks, the poll. Those run every
// few hundred milliseconds whether or not events come, so on a pool each
// would keep a session of its own open while the process is idle. They
// run on the listener's session instead (listener.Acquire), between two
// waits for a notification, so that an idle process holds two sessions:
// the listener's and its watcher's (docs/capacity.md, "Sessions"). While
// the listener has no session, or its session stays busy past
// controlPatience, a statement runs on the pool: the upkeep never waits
// for the listener to connect again.
//
// A notification that comes while the session runs upkeep statements is
// kept by the connection and read once the session is given back: a
// wake-up waits for the statements lent before it, each a short read or
// write (DESIGN.md, "Sessions": nothing that may wait long for a lock).
type control struct{ c *Consumer }

var _ schema.DB = control{}

// acquire lends the listener's session, or reports that the pool is to
// be used.
func (k control) acquire(ctx context.Context) (*pgx.Conn, func(), bool) {
	ln := k.c.ln.Load()
	if ln == nil || ctx.Err() != nil {
		return nil, nil, false
	}
	actx, cancel := context.WithTimeout(ctx, controlPatience)
	defer cancel()
	conn, release, err := ln.Acquire(actx)
	if err != nil {
		return nil, nil, false
	}
	return conn, release, true
}

// Exec implements schema.DB.
func (k control) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	conn, release, ok := k.acquire(ctx)
	if !ok {
		return k.c.pool.Exec(ctx, sql, args...)
	}
	defer release()
	return conn.Exec(ctx, sql, args...)
}

// QueryRow implements schema.DB; the session is given back by Scan.
func (k control) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	conn, release, ok := k.acquire(ctx)
	if !ok {
		return k.c.pool.QueryRow(ctx, sql, args...)
	}
	return lentRow{row: conn.QueryRow(ctx, sql, args...), release: release}
}

// Query implements schema.DB; the session is given back when the rows
// are closed or read to their end.
func (k control) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	conn, release, ok := k.acquire(ctx)
	if !ok {
		return k.c.pool.Query(ctx, sql, args...)
	}
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		release()
		return nil, err
	}
	return &lentRows{Rows: rows, release: sync.OnceFunc(release)}, nil
}

// SendBatch implements schema.DB; the session is given back by Close.
func (k control) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	conn, release, ok := k.acquire(ctx)
	if !ok {
		return k.c.pool.SendBatch(ctx, b)
	}
	return &lentBatch{BatchResults: conn.SendBatch(ctx, b), release: sync.OnceFunc(release)}
}

// Begin implements schema.DB; the session is given back by Commit or
// Rollback.
func (k control) Begin(ctx context.Context) (pgx.Tx, error) {
	return k.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx is Begin with options, as pools and connections have it
// (store.Begin uses it for READ COMMITTED).
func (k control) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	conn, release, ok := k.acquire(ctx)
	if !ok {
		return k.c.pool.BeginTx(ctx, opts)
	}
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		release()
		return nil, err
	}
	return &lentTx{Tx: tx, release: sync.OnceFunc(release)}, nil
}

// lentRow is a row read on the listener's session.
type lentRow struct {
	row     pgx.Row
	release func()
}

func (r lentRow) Scan(dest ...any) error {
	defer r.release()
	return r.row.Scan(dest...)
}

// lentRows are rows read on the listener's session.
type lentRows struct {
	pgx.Rows
	release func()
}

func (r *lentRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Rows.Close()
	r.release()
	return false
}

func (r *lentRows) Close() {
	r.Rows.Close()
	r.release()
}

// lentBatch is a batch run on the listener's session.
type lentBatch struct {
	pgx.BatchResults
	release func()
}

func (b *lentBatch) Close() error {
	err := b.BatchResults.Close()
	b.release()
	return err
}

// lentTx is a transaction on the listener's session.
type lentTx struct {
	pgx.Tx
	release func()
}

func (t *lentTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.release()
	return err
}

func (t *lentTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	t.release()
	return err
}
