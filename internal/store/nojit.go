package store

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// jitOffSQL turns JIT compilation off until the end of the (implicit)
// transaction: a batch's statements run in one, so it holds for the
// statement queued after it, and for nothing past the batch. JIT is on by
// default above a cost estimate, and the estimates of the status
// statements (a row per group and partition from generate_series, lateral
// reads of every segment) pass it on an empty log: compiling one took 7 to
// 9 seconds of CPU on a loaded 2-core machine, for a statement that reads
// a few index entries.
const jitOffSQL = `SELECT set_config('jit', 'off', true)`

// QueryWithoutJIT runs sql with JIT compilation off, in one round trip,
// whatever the session's settings (a caller's own pool, not the one
// NewPoolConfig makes, has JIT on). Closing the rows ends the batch and
// gives a pool's connection back.
func QueryWithoutJIT(ctx context.Context, db schema.DB, sql string, args ...any) (pgx.Rows, error) {
	var b pgx.Batch
	b.Queue(jitOffSQL)
	b.Queue(sql, args...)
	br := db.SendBatch(ctx, &b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return batchRows{Rows: rows, br: br}, nil
}

// batchRows are a batch's last rows: closing them closes the batch.
type batchRows struct {
	pgx.Rows
	br pgx.BatchResults
}

// Close closes the rows and the batch.
func (r batchRows) Close() {
	r.Rows.Close()
	_ = r.br.Close()
}
