package pgevents

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

// TestNewGroupAfterRepartitions: a group that runs for the first time
// after the topic was repartitioned twice (6 -> 5 -> 3) starts at the first
// event of the oldest layout and handles every event of every layout
// exactly once, in order per host, the events appended while it starts
// included (a soak once saw a group created after a repartition end its
// run "caught up" with most of the log unhandled; this is that start,
// without the crash that led to it).
func TestNewGroupAfterRepartitions(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 6)
	mustExec(t, pool, handledTable)
	appendSome := func(txs int) {
		for i := range txs {
			evs := make([]Event, 1+i%7)
			for k := range evs {
				evs[k] = ev(fmt.Sprintf("h%d", (i*3+k)%23), "t", `{}`)
			}
			appendTx(t, pool, evs...)
		}
	}
	appendSome(60)
	if _, err := schema.Repartition(ctx, pool, 1, 5); err != nil {
		t.Fatal(err)
	}
	appendSome(60)
	if _, err := schema.Repartition(ctx, pool, 1, 3); err != nil {
		t.Fatal(err)
	}
	appendSome(30)
	startConsumer(t, pool, Config{TotalPartitions: 3, Handlers: recordingHandlers()})
	appendSome(30)
	n := int64(queryInt(t, pool, `SELECT count(*) FROM outbox_message_t`))
	waitHandled(t, pool, n, 20*time.Second)
	checkHandled(t, pool)
}

// TestConsumerOutlivesItsSessions: the sessions of a running consumer end
// while its partitions sleep — the one holding its sleep keys alone (an
// idle session, as idle_session_timeout or a pooler ends them), or every
// one (an administrator, a failover) — after a repartition, again and
// again; the events appended after each time are handled, once and in
// order, and none waits for the poll (an hour). Without the watcher's check
// of its keys' session, the first round's events waited: appends found
// nobody asleep and notified nobody.
func TestConsumerOutlivesItsSessions(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 6)
	mustExec(t, pool, handledTable)
	i := 0
	appendSome := func(txs int) {
		for range txs {
			i++
			evs := make([]Event, 1+i%5)
			for k := range evs {
				evs[k] = ev(fmt.Sprintf("h%d", (i*3+k)%17), "t", `{}`)
			}
			appendTx(t, pool, evs...)
		}
	}
	appendSome(20)
	if _, err := schema.Repartition(ctx, pool, 1, 5); err != nil {
		t.Fatal(err)
	}
	cp := consumerPool(t, pool, 5, func(pc *pgxpool.Config) { pc.ConnConfig.RuntimeParams["application_name"] = "victim" })
	c, err := NewConsumer(cp, Config{GroupID: "g", TotalPartitions: 5, Handlers: recordingHandlers(), Schema: pgtest.Schema(),
		WaitPeriod: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	const keysHolder = `SELECT DISTINCT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1 AND a.datname = current_database()`
	for round := range 8 {
		appendSome(15)
		n := int64(queryInt(t, pool, `SELECT count(*) FROM outbox_message_t`))
		waitHandled(t, pool, n, 10*time.Second)
		// Asleep on every partition: the consumer's watcher, elected, holds
		// their sleep keys on a session of its own.
		pgtest.WaitFor(t, 10*time.Second, "the consumer sleeps on every partition", func() bool {
			return queryInt(t, pool, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock'
				  AND a.application_name = $1 AND a.datname = current_database()`, store.WatcherApplicationName(c.ReplicaID())) == 5
		})
		var killed int64
		if round%2 == 0 {
			killed = queryInt(t, pool, `SELECT count(pg_terminate_backend(pid)) FROM (`+keysHolder+`) k`, store.WatcherApplicationName(c.ReplicaID()))
		} else {
			killed = queryInt(t, pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND (application_name IN ('victim', $1) OR pid IN (SELECT b.pid FROM batch_backends($2) b))`,
				store.WatcherApplicationName(c.ReplicaID()), c.ReplicaID())
		}
		t.Logf("round %d: %d sessions terminated", round, killed)
	}
	appendSome(15)
	n := int64(queryInt(t, pool, `SELECT count(*) FROM outbox_message_t`))
	waitHandled(t, pool, n, 10*time.Second)
	checkHandled(t, pool)
}

// TestIdleProcessGivesSessionsBack: a consumer of 8 partitions, on the
// production pool (PoolSize, so each worker pins a session while it has
// work), gives its sessions back once nothing comes: its listener's
// session, which also runs its heartbeats (control), and its watcher's
// stay, not one per partition and none for the upkeep (maintenance opens
// one for each pass, a few milliseconds every MaintenanceInterval); of a
// sequenced topic, its listener's and its sequencer's (its ticks announce
// every partition they move: no watcher runs). Events appended after each
// quiet spell are handled once and in order, on sessions taken again.
// Without the worker's close after pinIdle, or with the upkeep on the pool
// (control's statements all run there), or with a watcher for a sequenced
// topic, the count does not come down to 2 within a minute.
func TestIdleProcessGivesSessionsBack(t *testing.T) {
	t.Parallel()
	for _, scope := range []string{schema.ScopeTopic, schema.ScopeSequenced} {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			testIdleSessions(t, scope)
		})
	}
}

// testIdleSessions is TestIdleProcessGivesSessionsBack for a topic of
// offset scope scope.
func testIdleSessions(t *testing.T, scope string) {
	const partitions = 8
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: partitions, Scope: scope})
	mustExec(t, pool, handledTable)
	startConsumer(t, pool, Config{TotalPartitions: partitions, Handlers: recordingHandlers()})
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	sessions := func() int64 {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgevents%'`)
	}
	names := func() string {
		var s string
		if err := pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(application_name, ', ' ORDER BY application_name), '') FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgevents%'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the consumer's sessions at the end: %s", names())
		}
	})
	total := 0
	for round := range 2 {
		for range 20 {
			evs := make([]Event, 1+rng.IntN(6))
			for k := range evs {
				evs[k] = ev(fmt.Sprintf("h%d", rng.IntN(40)), "t", `{}`)
			}
			appendTx(t, pool, evs...)
			total += len(evs)
		}
		waitHandled(t, pool, int64(total), 20*time.Second)
		busy := sessions()
		var idle int64
		pgtest.WaitFor(t, 60*time.Second, fmt.Sprintf("round %d (seed %d): the idle consumer's sessions down to 2 (%d after its batches)", round, seed, busy), func() bool {
			idle = sessions()
			return idle <= 2
		})
		t.Logf("round %d: %d sessions after the batches, %d idle", round, busy, idle)
	}
	checkHandled(t, pool)
}
