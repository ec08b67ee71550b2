package pgevents

import (
	"context"
	"testing"
	"time"
)

// TestAppendCommit: the append and the commit travel in one round trip;
// the events and the transaction's other writes commit together, the
// append lock is free when it returns, and a failed append rolls the whole
// transaction back.
func TestAppendCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 2)
	mustExec(t, pool, `CREATE TABLE public.business (k text PRIMARY KEY)`)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO business VALUES ('a')`); err != nil {
		t.Fatal(err)
	}
	offs, err := AppendCommit(ctx, tx, ev("h1", "t", `{"n":1}`), ev("h2", "t", `{"n":2}`), Event{TopicID: 1, HostID: "h3", EventType: "t"})
	if err != nil || len(offs) != 3 {
		t.Fatalf("AppendCommit = %v, %v", offs, err)
	}
	if err := tx.Rollback(ctx); err != nil { // releases the connection; the transaction is over
		t.Fatalf("Rollback after AppendCommit: %v", err)
	}
	if n := queryInt(t, pool, `SELECT (SELECT count(*) FROM business) + (SELECT count(*) FROM outbox_message_t)`); n != 4 {
		t.Fatalf("%d rows committed, want the business row and 3 events", n)
	}
	// The append lock is free: another producer appends at once.
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := Append(lctx, pool, ev("h1", "t", `{}`)); err != nil {
		t.Fatalf("append after AppendCommit: %v", err)
	}
	// A failed append: nothing of the transaction commits.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO business VALUES ('b')`); err != nil {
		t.Fatal(err)
	}
	if _, err := AppendCommit(ctx, tx, Event{TopicID: 99, HostID: "h", EventType: "t"}); err == nil {
		t.Fatal("AppendCommit to a topic that does not exist succeeded")
	}
	_ = tx.Rollback(ctx)
	if n := queryInt(t, pool, `SELECT count(*) FROM business WHERE k = 'b'`); n != 0 {
		t.Fatal("the business write of a failed AppendCommit committed")
	}
}

// TestAppendCommitOnAcquiredConn: a transaction begun on an acquired
// connection needs no Rollback after AppendCommit: the connection is idle
// when it returns, committed or rolled back, and goes back to the pool as
// it is.
func TestAppendCommitOnAcquiredConn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 2)
	for _, topic := range []int{1, 99} { // 99 does not exist: the append fails
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			conn.Release()
			t.Fatal(err)
		}
		_, err = AppendCommit(ctx, tx, Event{TopicID: topic, HostID: "h", EventType: "t"})
		st := conn.Conn().PgConn().TxStatus()
		conn.Release()
		if (err == nil) != (topic == 1) {
			t.Fatalf("AppendCommit to topic %d: %v", topic, err)
		}
		if st != 'I' {
			t.Fatalf("after AppendCommit to topic %d the connection's transaction status is %q, want idle", topic, st)
		}
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t`); n != 1 {
		t.Fatalf("%d events committed, want 1", n)
	}
}
