package consumercli

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/internal/backoff"
)

// startWaitMsg is the line `consumer run` logs while it waits for the
// database at start, once per backoff.DefaultInterval with the count of
// the attempts since ("repeated").
const startWaitMsg = "cannot connect at start; waiting for the database and retrying"

// openPoolsWaiting is openPools for `consumer run`: a failure to connect
// that can pass (passingConnect: the server's connection slots are taken,
// it is starting up or shutting down) is waited out with
// backoff.Retry's back-off (DefaultMin doubling to DefaultMax, with
// jitter), as a lost connection is, rather than exiting into a restart a
// second under systemd's Restart=always. A permanent failure (a bad
// password, a missing database, a configuration error) returns at once,
// and so does a refused or unanswered connection: nothing says it will
// pass, and a wrong host or port looks the same (the unit's After= orders
// the start behind a local server).
// It returns ctx's error when ctx ends while waiting.
func openPoolsWaiting(ctx context.Context, cfg *config.Config, path string, log zerolog.Logger) ([]*pgxpool.Pool, func(), error) {
	r := backoff.New(log, "start-up connect")
	for {
		pools, closeAll, err := openPools(ctx, cfg, path)
		if err == nil {
			r.Ok()
			return pools, closeAll, nil
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		if !passingConnect(err) {
			return nil, nil, err
		}
		if !backoff.Sleep(ctx, r.Fail(err, startWaitMsg)) {
			return nil, nil, ctx.Err()
		}
	}
}

// passingConnect reports whether err, a failure to connect, is one that
// waiting can cure: too many connections (53300: the server's or the
// role's limit, or the slots reserved for superusers), the server starting
// up or shutting down (57P03, 57P01): the server answered and said so. A
// bad password or role (28xxx), a database that does not exist (3D000)
// and a connection nobody answers are not.
func passingConnect(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "53300" || pgErr.Code == "57P03" || pgErr.Code == "57P01"
	}
	// pgx flattens some attempts' errors into text.
	msg := err.Error()
	return strings.Contains(msg, "SQLSTATE 53300") || strings.Contains(msg, "SQLSTATE 57P03") ||
		strings.Contains(msg, "SQLSTATE 57P01")
}
