package store

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// TestSleepGivesWayToAppendsInFlight: the sleep protocol from the
// consumer's side. A consumer cannot go to sleep on a partition while an
// append there is in flight, even one that holds no sleep key (it found the
// previous append's still held, and notifies nobody): Sleep gives the key
// back and says so. Once the append commits, Sleep takes the key and reads
// the append's event in the tail; an append after that notifies.
func TestSleepGivesWayToAppendsInFlight(t *testing.T) {
	t.Parallel()
	ctx, url := setup(t, 1)
	pool := pgtest.Pool(t, url)
	consumer, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close(ctx)
	ln, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close(ctx)
	if _, err := ln.Exec(ctx, `LISTEN event_channel`); err != nil {
		t.Fatal(err)
	}
	holdsSleepKey := func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l, (SELECT lock_key('sleep', '1/0') AS k) s
			WHERE l.locktype = 'advisory' AND l.granted AND l.pid = $1
			  AND l.classid = ((s.k >> 32) & 4294967295)::oid AND l.objid = (s.k & 4294967295)::oid`, consumer.PgConn().PID()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}

	// The previous append, committing, holds the sleep key; the append
	// after it cannot take it, and is marked in flight.
	prev, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer prev.Rollback(ctx) //nolint:errcheck
	if _, err := prev.Exec(ctx, `SELECT pg_advisory_xact_lock(lock_key('sleep', '1/0'))`); err != nil {
		t.Fatal(err)
	}
	app, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Rollback(ctx) //nolint:errcheck
	if _, err := app.Exec(ctx, `SELECT append_event(1, 'h', '', 't', '{}')`); err != nil {
		t.Fatal(err)
	}
	if err := prev.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The consumer tries to sleep: the append is in flight.
	got, err := Sleep(ctx, consumer, 1, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Got || holdsSleepKey() {
		t.Fatalf("asleep (%+v, key held %v) while an append that notifies nobody is in flight", got[0], holdsSleepKey())
	}
	if err := app.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Committed: asleep now, with the append's event in the tail.
	got, err = Sleep(ctx, consumer, 1, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	if !got[0].Got || got[0].Tail != 1 || !holdsSleepKey() {
		t.Fatalf("after the commit: %+v, key held %v; want asleep with tail 1", got[0], holdsSleepKey())
	}
	// Asleep: the next append notifies.
	if _, err := pool.Exec(ctx, `SELECT append_event(1, 'h', '', 't', '{}')`); err != nil {
		t.Fatal(err)
	}
	n, err := ln.WaitForNotification(ctx)
	if err != nil || n.Payload != "1:0/2" {
		t.Fatalf("notification %v, %v; want 1:0/2", n, err)
	}
	if err := Wake(ctx, consumer, 1, []int{0}); err != nil || holdsSleepKey() {
		t.Fatalf("wake: %v, key held %v", err, holdsSleepKey())
	}
}
