package pgevents

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file: the session timeouts a consumer runs under. They come from
// the consumer's pool (NewPoolConfig sets statement_timeout and
// idle_in_transaction_session_timeout unless told to leave the server's)
// or from the server: a role's or a database's settings (ALTER ROLE ...
// SET, common on managed databases) apply to every setting the
// connection does not send. Run reads what a pool session ends up with,
// logs it, and refuses a combination that cannot work.
//
//   - idle_in_transaction_session_timeout must leave room for one unit's
//     handler budget and a batch's round trips (idleSlack): a batch stops
//     taking units halfway through the rest (idleCut), so the server
//     never ends it for idling;
//   - statement_timeout and lock_timeout cancel a statement that runs too
//     long: a handler's is a timeout of its unit (unitTimedOut), which
//     counts towards MaxAttempts; the claim's wait for an append in
//     flight stays below half of statement_timeout (awaitMax), so the
//     consumer's own statements are never its victims.

// idleSlack is what a batch needs, beyond a unit's handler budget,
// between two of its statements: the round trips of the savepoint, the
// next fetch or the commit, and the client's own work between them (a
// few milliseconds on a LAN; a tenth of a second leaves room for a
// congested link).
const idleSlack = 100 * time.Millisecond

// sessionTimeoutsSQL reads, on one of the pool's sessions, the timeouts
// its statements run under, where each comes from, and the role.
const sessionTimeoutsSQL = `SELECT name, setting::bigint, source, current_user::text
FROM pg_settings
WHERE name IN ('statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout')`

// sessionTimeout is one of the timeouts of a consumer's sessions.
type sessionTimeout struct {
	value  time.Duration // 0: none
	source string        // pg_settings.source
}

// checkTimeouts reads the timeouts of the pool's sessions, logs them,
// refuses with a *TimeoutError an idle_in_transaction_session_timeout too
// short for HandlerTimeout, and derives idleCut and awaitMax.
func (c *Consumer) checkTimeouts(ctx context.Context) error {
	rows, err := c.pool.Query(ctx, sessionTimeoutsSQL)
	if err != nil {
		return fmt.Errorf("read the sessions' timeouts: %w", err)
	}
	got := map[string]sessionTimeout{}
	var role string
	var name, source string
	var ms int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &ms, &source, &role}, func() error {
		got[name] = sessionTimeout{value: time.Duration(ms) * time.Millisecond, source: source}
		return nil
	}); err != nil {
		return fmt.Errorf("read the sessions' timeouts: %w", err)
	}
	stmt, lock, idle := got["statement_timeout"], got["lock_timeout"], got["idle_in_transaction_session_timeout"]
	c.log.Info().Str("role", role).
		Int64("statement_timeout_ms", stmt.value.Milliseconds()).Str("statement_timeout_source", stmt.source).
		Int64("lock_timeout_ms", lock.value.Milliseconds()).Str("lock_timeout_source", lock.source).
		Int64("idle_in_transaction_session_timeout_ms", idle.value.Milliseconds()).Str("idle_in_transaction_session_timeout_source", idle.source).
		Int64("handler_timeout_ms", c.cfg.HandlerTimeout.Milliseconds()).
		Msg("session timeouts (0: none)")
	if idle.value > 0 {
		if idle.value <= c.cfg.HandlerTimeout+idleSlack {
			return &TimeoutError{HandlerTimeout: c.cfg.HandlerTimeout, IdleTimeout: idle.value, Source: idle.source, Role: role}
		}
		// A unit starting at the cut still ends, within its budget, before
		// the server's limit.
		c.idleCut = (idle.value - c.cfg.HandlerTimeout) / 2
	}
	if stmt.value > 0 {
		c.awaitMax = stmt.value / 2
		if stmt.value < c.cfg.HandlerTimeout {
			c.log.Info().Int64("statement_timeout_ms", stmt.value.Milliseconds()).Int64("handler_timeout_ms", c.cfg.HandlerTimeout.Milliseconds()).
				Msg("statement_timeout is shorter than the handler timeout: a handler's statement that runs longer is cancelled by the server, and counts as a timeout of its unit (maxAttempts, then onPermanentFailure)")
		}
	}
	return nil
}
