package pgevents

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/netconn"
)

// The session timeouts of a consumer's connections, unless PoolOptions or
// the connection URL set others.
const (
	DefaultStatementTimeout         = 30 * time.Second
	DefaultIdleInTransactionTimeout = time.Minute
)

// How long a consumer pool keeps a connection nobody uses, and how often
// it looks, unless the connection URL sets pool_max_conn_idle_time and
// pool_health_check_period. pgxpool's defaults (30 minutes, looked at
// every minute) would keep every session a busy spell opened for half an
// hour: a process would hold PoolSize sessions while it has nothing to
// do. With these, and the workers closing their own sessions after
// pinIdle, an idle process holds two within about 30 s of its last event
// (docs/capacity.md, "Sessions"). A closed connection costs a connect (and
// its statements prepared again) when the pool needs it again; the
// consumer's upkeep runs on the listener's session (control), not on the
// pool, so nothing keeps a pool session open while no event comes.
const (
	DefaultMaxConnIdleTime   = 20 * time.Second
	DefaultHealthCheckPeriod = 5 * time.Second
)

// ServerSetting, as a timeout of PoolOptions, leaves the server's setting
// in place: pgevents sends none.
const ServerSetting time.Duration = -1

// PoolOptions are the session settings of a consumer pool that
// NewPoolConfig sets unless the connection URL sets them itself.
type PoolOptions struct {
	// StatementTimeout is statement_timeout; default
	// DefaultStatementTimeout, ServerSetting for the server's.
	StatementTimeout time.Duration
	// IdleInTransactionTimeout is idle_in_transaction_session_timeout, so
	// that no consumer pins the xmin horizon for long; default
	// DefaultIdleInTransactionTimeout, ServerSetting for the server's. It
	// must be longer than Config.HandlerTimeout (Run checks).
	IdleInTransactionTimeout time.Duration
}

// ParsePoolConfig is NewPoolConfig with the default PoolOptions.
func ParsePoolConfig(url string) (*pgxpool.Config, error) {
	return NewPoolConfig(url, PoolOptions{})
}

// NewPoolConfig parses a connection URL into a pool configuration suited to
// a consumer: TCP keepalive and TCP_USER_TIMEOUT on every connection (so
// that the server and the client notice a dead peer in seconds, and a batch
// stuck on a vanished server fails instead of hanging), application_name
// "pgevents-consumer", the session timeouts of opts, server-side TCP
// keepalive and user timeout so that the server notices a dead consumer
// too, synchronous_commit off (see below why it keeps exactly-once) and jit
// off, each unless the URL sets it. Set MaxConns to PoolSize of the
// partitions served before creating the pool. The pool closes a connection
// idle for DefaultMaxConnIdleTime, looking every DefaultHealthCheckPeriod,
// unless the URL sets pool_max_conn_idle_time or pool_health_check_period.
func NewPoolConfig(url string, opts PoolOptions) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("pgevents: parse database url: %w", err)
	}
	pc.ConnConfig.DialFunc = netconn.Dial
	if !strings.Contains(url, "pool_max_conn_idle_time") {
		pc.MaxConnIdleTime = DefaultMaxConnIdleTime
	}
	if !strings.Contains(url, "pool_health_check_period") {
		pc.HealthCheckPeriod = DefaultHealthCheckPeriod
	}
	params := map[string]string{
		"application_name": "pgevents-consumer",
		// The server's side of the connection: notice a vanished consumer
		// (power loss, network cut) in seconds and end its transaction,
		// releasing the partition's offsets row.
		"tcp_keepalives_idle":     "5",
		"tcp_keepalives_interval": "1",
		"tcp_keepalives_count":    "3",
		"tcp_user_timeout":        "10000",
		// A consumer's commit need not wait for the WAL flush: a crash can
		// lose its last few milliseconds of commits, but the offset and the
		// handlers' effects are lost together and the batch is handled
		// again, so exactly-once holds; and WAL is flushed in order, so
		// nothing committed after them (by producers) survives without
		// them.
		"synchronous_commit": "off",
		// Every statement of a consumer is short; JIT compilation (on by
		// default above a cost estimate) would add a second or more to
		// the few whose estimates are inflated, such as the status query.
		"jit": "off",
	}
	for param, d := range map[string]time.Duration{
		"statement_timeout":                   cmp.Or(opts.StatementTimeout, DefaultStatementTimeout),
		"idle_in_transaction_session_timeout": cmp.Or(opts.IdleInTransactionTimeout, DefaultIdleInTransactionTimeout),
	} {
		if d > 0 {
			params[param] = strconv.FormatInt(d.Milliseconds(), 10)
		}
	}
	for param, value := range params {
		if pc.ConnConfig.RuntimeParams[param] == "" {
			pc.ConnConfig.RuntimeParams[param] = value
		}
	}
	// A startup parameter overrides the role's and the database's
	// defaults (ALTER ROLE/DATABASE ... SET).
	pc.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	return pc, nil
}

// PoolSize returns the connections a consumer needs to serve partitions
// partitions without waiting for one: a batch connection per partition,
// and one each for the poller, the lease heartbeat, the subscription
// heartbeat, maintenance and the wake-up rechecks. The listener has a
// connection of its own, outside the pool, and the upkeep runs on it
// while it is up (control): of those five, an idle process keeps only the
// watcher's session open, and opens the others for maintenance's passes
// and while the listener's session is away or busy. Given a pool
// of at least that many, each worker keeps its connection while it owns
// its partition and finds work at least every 20 seconds, so that its
// statements are prepared and planned once; with fewer, the workers take
// turns. Consumers sharing one pool need the sum of theirs.
func PoolSize(partitions int) int { return partitions + 5 }
