package pgevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// TestIdempotentAppends is a randomized test of idempotency keys against a
// model: sessions append transactions of events, most with a key drawn from
// a small set that they share, some rolled back, some run twice (a
// producer that lost the COMMIT's reply and retried), while a consumer
// group reads the log. Every key of a committed transaction is in the log
// exactly once; a key only rolled back is not; a duplicate is told apart and
// names its key's event; offsets stay gapless; nothing deadlocks (one call
// per transaction and topic, as the docs ask).
func TestIdempotentAppends(t *testing.T) {
	t.Parallel()
	seed := pgtest.Seed(t)
	for _, scope := range []string{schema.ScopeTopic, schema.ScopePartition} {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 4, Scope: scope})
			mustExec(t, pool, handledTable)
			startConsumer(t, pool, Config{TotalPartitions: 4, Handlers: recordingHandlers()})
			type payload struct {
				K string `json:"k"`
			}
			var mu sync.Mutex
			// The events each key should have in the log: one for a key of
			// a committed transaction; for an event without a key, one per
			// committed run of its transaction.
			want := map[string]int64{}
			var wg sync.WaitGroup
			for s := range 8 {
				r := pgtest.Rand(seed, s)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := range 40 {
						evs := make([]Event, 1+r.IntN(4))
						for i := range evs {
							key := ""
							if r.IntN(5) > 0 {
								key = fmt.Sprintf("key-%d", r.IntN(30))
							} else {
								key = fmt.Sprintf("free-%d-%d-%d", s, n, i) // unkeyed, named for the check
							}
							b, _ := json.Marshal(payload{K: key})
							evs[i] = Event{HostID: fmt.Sprintf("h%d", r.IntN(9)), EventType: "t", Payload: b}
							if key[0] == 'k' {
								evs[i].IdempotencyKey = key
							}
						}
						via := appendVia(r.IntN(4))
						if via == viaSQLOne && len(evs) > 1 {
							via = viaSQLArray
						}
						rollback := r.IntN(100) < 15
						runs := 1
						if r.IntN(100) < 20 {
							runs = 2 // the reply to COMMIT was lost: run it again
						}
						for run := range runs {
							var res []AppendResult
							err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
								var err error
								res, err = via.append(ctx, tx, evs)
								if err == nil && rollback {
									return errRollback
								}
								return err
							})
							if rollback && errors.Is(err, errRollback) {
								continue
							}
							if err != nil {
								t.Errorf("session %d, transaction %d, run %d: %v", s, n, run, err)
								return
							}
							for i, e := range evs {
								var want payload
								_ = json.Unmarshal(e.Payload, &want)
								if via != viaResults {
									// Offsets only: one of the key's events has it.
									var n int
									if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1 AND c_offset = $1 AND payload->>'k' = $2`,
										res[i].Offset, want.K).Scan(&n); err != nil || n == 0 {
										t.Errorf("%s: event %d: offset %d names no event of its key (%v)", via, i, res[i].Offset, err)
									}
									continue
								}
								if run == 1 && e.IdempotencyKey != "" && !res[i].Duplicate {
									t.Errorf("the retried append of key %s was not a duplicate", e.IdempotencyKey)
								}
								if e.IdempotencyKey == "" && res[i].Duplicate {
									t.Errorf("an event without a key was a duplicate")
								}
								// The offset and partition name the key's one event.
								var got string
								if err := pool.QueryRow(ctx, `SELECT payload->>'k' FROM outbox_message_t WHERE topic_id = 1 AND partition_id = $1 AND c_offset = $2`,
									res[i].Partition, res[i].Offset).Scan(&got); err != nil {
									t.Errorf("event %d of a transaction: result %+v names no event: %v", i, res[i], err)
								} else if got != want.K {
									t.Errorf("event %d: result %+v names the event of %q, want %q", i, res[i], got, want.K)
								}
							}
							mu.Lock()
							for _, e := range evs {
								var p payload
								_ = json.Unmarshal(e.Payload, &p)
								if e.IdempotencyKey != "" {
									want[p.K] = 1
								} else {
									want[p.K]++
								}
							}
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			// Exactly one event per committed key, none for the others.
			rows, err := pool.Query(ctx, `SELECT payload->>'k', count(*) FROM outbox_message_t WHERE topic_id = 1 GROUP BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			inLog := map[string]int64{}
			var k string
			var c int64
			if _, err := pgx.ForEachRow(rows, []any{&k, &c}, func() error { inLog[k] = c; return nil }); err != nil {
				t.Fatal(err)
			}
			var events int64
			for key, n := range want {
				if inLog[key] != n {
					t.Errorf("%s is %d times in the log, want %d", key, inLog[key], n)
				}
			}
			for key, n := range inLog {
				events += n
				if want[key] == 0 {
					t.Errorf("%s is %d times in the log, and no transaction with it committed", key, n)
				}
			}
			// Gapless offsets, per scope.
			gaps := `SELECT count(*) FROM (SELECT max(c_offset) - count(*) AS g FROM outbox_message_t WHERE topic_id = 1 GROUP BY partition_id) x WHERE g <> 0`
			if scope == schema.ScopeTopic {
				gaps = `SELECT max(c_offset) - count(*) FROM outbox_message_t WHERE topic_id = 1`
			}
			if n := queryInt(t, pool, gaps); n != 0 {
				t.Fatalf("offsets have gaps (%d)", n)
			}
			waitHandled(t, pool, events, 20*time.Second)
			checkHandled(t, pool)
			t.Logf("%d events in the log, %d names", events, len(inLog))
		})
	}
}

// TestIdempotencyWindow: a key older than its topic's window is appended
// again; maintenance deletes the keys past it.
func TestIdempotencyWindow(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 2)
	// Two seconds: the two appends "within the window" run back to back,
	// but a loaded machine under -race once put 300 ms between them.
	if err := schema.SetIdempotencyWindow(ctx, pool, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	e := Event{HostID: "h", EventType: "t", IdempotencyKey: "once"}
	first, err := AppendResults(ctx, pool, e)
	if err != nil {
		t.Fatal(err)
	}
	again, err := AppendResults(ctx, pool, e)
	if err != nil {
		t.Fatal(err)
	}
	if first[0].Duplicate || !again[0].Duplicate || again[0] != (AppendResult{Offset: first[0].Offset, Partition: first[0].Partition, Duplicate: true}) {
		t.Fatalf("first %+v, again within the window %+v", first[0], again[0])
	}
	time.Sleep(2100 * time.Millisecond) // past the window: the clock is the subject
	later, err := AppendResults(ctx, pool, e)
	if err != nil {
		t.Fatal(err)
	}
	if later[0].Duplicate || later[0].Offset == first[0].Offset {
		t.Fatalf("past the window: %+v, want a new event", later[0])
	}
	time.Sleep(2100 * time.Millisecond) // the second key past the window too
	m, err := Maintain(ctx, pool, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM idempotency_keys`); n != 0 || m.Pruned == 0 {
		t.Fatalf("%d keys left past the window, %d rows pruned", n, m.Pruned)
	}
}

// TestIdempotencyWindowOfALongTransaction: the window counts from the clock
// time a key is appended, not from the start of its transaction. A
// producer transaction that has been open longer than the window appends a
// key and commits; a retry right after is a duplicate of its event.
func TestIdempotencyWindowOfALongTransaction(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 2)
	if err := schema.SetIdempotencyWindow(ctx, pool, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	e := Event{HostID: "h", EventType: "t", IdempotencyKey: "slow"}
	var first []AppendResult
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The transaction's start (now()) falls out of the window before
		// the append: the scenario itself, so the wait is in the database.
		if _, err := tx.Exec(ctx, `SELECT pg_sleep_until(now() + interval '2.2 s')`); err != nil {
			return err
		}
		var err error
		first, err = AppendResults(ctx, tx, e)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	again, err := AppendResults(ctx, pool, e)
	if err != nil {
		t.Fatal(err)
	}
	if want := (AppendResult{Offset: first[0].Offset, Partition: first[0].Partition, Duplicate: true}); first[0].Duplicate || again[0] != want {
		t.Fatalf("the retry of a key appended by a transaction open past the window: %+v, want %+v (the first append's)", again[0], want)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1`); n != 1 {
		t.Fatalf("%d events in the log, want 1", n)
	}
}

// TestIdempotentDuplicateOfAPrunedKey: a call with two keys finds the first
// one appended (a duplicate), then waits for the second, which an open
// transaction holds. Meanwhile the first key passes the window and
// prune_keys deletes its row. The call returns the first key's event, read
// before it was deleted: no NULL offset, one event per key in the log.
func TestIdempotentDuplicateOfAPrunedKey(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 2)
	if err := schema.SetIdempotencyWindow(ctx, pool, 1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	ev := func(key string) Event {
		return Event{HostID: "h-" + key, EventType: "t", Payload: json.RawMessage(`{"k":"` + key + `"}`), IdempotencyKey: key}
	}
	first, err := AppendResults(ctx, pool, ev("a"))
	if err != nil {
		t.Fatal(err)
	}
	// An open transaction holds key b.
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	held, err := AppendResults(ctx, holder, ev("b"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pid := int64(conn.Conn().PgConn().PID())
	type outcome struct {
		res []AppendResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := AppendResults(ctx, conn, ev("a"), ev("b"))
		done <- outcome{res, err}
	}()
	pgtest.WaitFor(t, 10*time.Second, "the call waits for key b", func() bool {
		return queryInt(t, pool, `SELECT cardinality(pg_blocking_pids($1))`, pid) > 0
	})
	pgtest.WaitFor(t, 10*time.Second, "key a past the window", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM idempotency_keys ik JOIN log_counter lc USING (topic_id)
WHERE ik.key = 'a' AND ik.created_at < clock_timestamp() - lc.idempotency_window`) == 1
	})
	if n := queryInt(t, pool, `SELECT prune_keys(1)`); n != 1 {
		t.Fatalf("prune_keys deleted %d keys, want 1 (key a)", n)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var out outcome
	select {
	case out = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the call still waits after the holder committed")
	}
	if out.err != nil {
		t.Fatalf("a duplicate whose key was pruned while the call waited: %v", out.err)
	}
	want := []AppendResult{
		{Offset: first[0].Offset, Partition: first[0].Partition, Duplicate: true},
		{Offset: held[0].Offset, Partition: held[0].Partition, Duplicate: true},
	}
	if fmt.Sprint(out.res) != fmt.Sprint(want) {
		t.Fatalf("results %+v, want %+v", out.res, want)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1`); n != 2 {
		t.Fatalf("%d events in the log, want 2 (one per key)", n)
	}
}

// TestIdempotentDuplicatesWhilePruning: sessions append one key over and
// over under a window of a millisecond, so that its row passes the window
// all the time, while prune_keys runs in a loop and each claim deletes the
// row it finds past the window: the row is often deleted between the
// conflict that makes an append a duplicate and the read of its event. No
// append fails or returns a NULL offset, every duplicate names an event of
// the key, and the log holds one event per append that was not a
// duplicate.
func TestIdempotentDuplicatesWhilePruning(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 2)
	if err := schema.SetIdempotencyWindow(ctx, pool, 1, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	const sessions = 6
	e := Event{HostID: "h", EventType: "t", IdempotencyKey: "k"}
	deadline := time.Now().Add(2 * time.Second)
	var appended, duplicates atomic.Int64
	var wg sync.WaitGroup
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				res, err := AppendResults(ctx, pool, e)
				if err != nil {
					t.Errorf("session %d: %v", s, err)
					return
				}
				if !res[0].Duplicate {
					appended.Add(1)
					continue
				}
				duplicates.Add(1)
				var n int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1 AND partition_id = $1 AND c_offset = $2`,
					res[0].Partition, res[0].Offset).Scan(&n); err != nil || n != 1 {
					t.Errorf("session %d: the duplicate %+v names no event (%v)", s, res[0], err)
					return
				}
			}
		}()
	}
	// Maintenance, as often as it can.
	var pruned int64
	for time.Now().Before(deadline) {
		pruned += queryInt(t, pool, `SELECT prune_keys(1)`)
	}
	wg.Wait()
	if n := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1`); n != appended.Load() {
		t.Errorf("%d events in the log, %d appends that were not duplicates", n, appended.Load())
	}
	t.Logf("%d events, %d duplicates, %d keys pruned", appended.Load(), duplicates.Load(), pruned)
}

// appendVia is a way to append in TestIdempotentAppends.
type appendVia int

const (
	viaResults  appendVia = iota // AppendResults
	viaAppend                    // Append
	viaSQLArray                  // SQL append_events, keys in the objects
	viaSQLOne                    // SQL append_event(..., idempotency_key => k)
)

func (v appendVia) String() string {
	return [...]string{"AppendResults", "Append", "append_events", "append_event"}[v]
}

// append appends evs in tx; only viaResults fills in more than offsets.
func (v appendVia) append(ctx context.Context, tx pgx.Tx, evs []Event) ([]AppendResult, error) {
	switch v {
	case viaResults:
		return AppendResults(ctx, tx, evs...)
	case viaAppend:
		offs, err := Append(ctx, tx, evs...)
		return resultsOf(offs), err
	case viaSQLOne:
		e := evs[0]
		var key *string
		if e.IdempotencyKey != "" {
			key = &e.IdempotencyKey
		}
		var off int64
		err := tx.QueryRow(ctx, `SELECT append_event(1, $1, '', $2, $3::jsonb, idempotency_key => $4)`,
			e.HostID, e.EventType, string(e.Payload), key).Scan(&off)
		return []AppendResult{{Offset: off}}, err
	}
	type item struct {
		HostID    string          `json:"host_id"`
		EventType string          `json:"event_type"`
		Payload   json.RawMessage `json:"payload"`
		Key       string          `json:"idempotency_key,omitempty"`
	}
	items := make([]item, len(evs))
	for i, e := range evs {
		items[i] = item{HostID: e.HostID, EventType: e.EventType, Payload: e.Payload, Key: e.IdempotencyKey}
	}
	b, _ := json.Marshal(items)
	var offs []int64
	err := tx.QueryRow(ctx, `SELECT array_agg(o ORDER BY i) FROM append_events(1, $1) WITH ORDINALITY AS t(o, i)`, b).Scan(&offs)
	return resultsOf(offs), err
}

func resultsOf(offs []int64) []AppendResult {
	out := make([]AppendResult, len(offs))
	for i, o := range offs {
		out[i].Offset = o
	}
	return out
}
