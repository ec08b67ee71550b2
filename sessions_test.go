package pgevents

import (
	"context"
	"fmt"
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

// TestConsumerOutlivesItsSessions: every session of a running consumer is
// terminated (an administrator, a pooler's restart, idle_session_timeout
// on the watcher's idle connection) while its partitions sleep, after a
// repartition, again and again; the events appended after each time are
// handled, once and in order, and none waits for the poll (an hour).
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
	for round := range 6 {
		appendSome(15)
		n := int64(queryInt(t, pool, `SELECT count(*) FROM outbox_message_t`))
		waitHandled(t, pool, n, 10*time.Second)
		// Asleep: the consumer holds sleep keys on a session of its own.
		pgtest.WaitFor(t, 10*time.Second, "the consumer sleeps", func() bool {
			return queryInt(t, pool, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE l.locktype = 'advisory' AND a.application_name = 'victim' AND a.datname = current_database()`) > 0
		})
		killed := queryInt(t, pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name IN ('victim', $1)`, store.BatchApplicationName(c.ReplicaID()))
		t.Logf("round %d: %d sessions terminated", round, killed)
	}
	appendSome(15)
	n := int64(queryInt(t, pool, `SELECT count(*) FROM outbox_message_t`))
	waitHandled(t, pool, n, 10*time.Second)
	checkHandled(t, pool)
}
