package pgevents

import (
	"context"
	"io"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// These benchmarks run on the test server, which pgtest starts with fsync
// and synchronous_commit off: they measure CPU and round trips, not the
// disk. `consumer bench` measures with durable commits (see BENCHMARKS.md).

// benchPool returns a pool of maxConns connections on a fresh migrated
// database holding topic 1 with the given partition count.
func benchPool(b *testing.B, partitions, maxConns int) *pgxpool.Pool {
	b.Helper()
	u, err := url.Parse(pgtest.MigratedDB(b))
	if err != nil {
		b.Fatal(err)
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(maxConns))
	u.RawQuery = q.Encode()
	pool := pgtest.Pool(b, u.String())
	if _, _, err := schema.EnsureTopic(context.Background(), pool, 1, partitions); err != nil {
		b.Fatal(err)
	}
	return pool
}

// benchEvents returns n events for hosts spread over many partitions.
func benchEvents(n, from int) []Event {
	evs := make([]Event, n)
	for i := range evs {
		k := from + i
		evs[i] = Event{HostID: "host-" + strconv.Itoa(k%1000), UserID: "u", EventType: "bench",
			Payload: []byte(`{"seq":` + strconv.Itoa(k) + `}`)}
	}
	return evs
}

// benchmarkAppend appends transactions of size events, one per op, with
// Append, and reports events/s.
func benchmarkAppend(b *testing.B, size int) {
	pool := benchPool(b, 8, 4)
	evs := benchEvents(size, 0)
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		appendBenchTx(b, pool, evs)
	}
	b.ReportMetric(float64(b.N*size)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkAppendSingle: one transaction with one event per op.
func BenchmarkAppendSingle(b *testing.B) { benchmarkAppend(b, 1) }

// BenchmarkAppend100: one transaction with 100 events per op.
func BenchmarkAppend100(b *testing.B) { benchmarkAppend(b, 100) }

// BenchmarkConsume: one op is one event read, decoded, handled by a no-op
// handler and committed by a consumer serving 8 partitions (batch size
// 1000), draining a backlog appended beforehand in 100-event transactions.
// Allocations are the whole process's per event, pgx's included.
func BenchmarkConsume(b *testing.B) {
	const partitions = 8
	pool := benchPool(b, partitions, PoolSize(partitions))
	ctx := context.Background()
	for i := 0; i < b.N; i += 100 {
		appendBenchTx(b, pool, benchEvents(min(100, b.N-i), i))
	}
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(context.Context, pgx.Tx, *Event) error { return nil }))
	c, err := NewConsumer(pool, Config{GroupID: "bench", TotalPartitions: partitions, BatchSize: 1000, Handlers: hs})
	if err != nil {
		b.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() { done <- c.Run(cctx) }()
	deadline := time.Now().Add(5 * time.Minute)
	for c.Stats().Handled < int64(b.N) {
		if time.Now().After(deadline) {
			b.Fatalf("handled %d of %d events in 5 minutes", c.Stats().Handled, b.N)
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// appendBenchTx appends evs in one transaction.
func appendBenchTx(b *testing.B, pool *pgxpool.Pool, evs []Event) {
	b.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := Append(ctx, tx, evs...)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkDecodePayload: the client-side cost of reading a jsonb payload
// per event, as store.Fetch and Claim do (into a json.RawMessage, which
// pgx fills through json.Unmarshal: validation and a copy), against a scan
// into a plain []byte (which pgx fills with a copy). One op is one row of
// a 1,000-row result; the server's share is the same in both.
func BenchmarkDecodePayload(b *testing.B) {
	pool := benchPool(b, 1, 2)
	ctx := context.Background()
	const query = `SELECT jsonb_build_object('producer', 3, 'seq', g, 'name', 'bench event')
FROM generate_series(1, 1000) g`
	for _, tc := range []struct {
		name string
		scan func(rows pgx.Rows, ev *Event) error
	}{
		{"RawMessage", func(rows pgx.Rows, ev *Event) error { return rows.Scan(&ev.Payload) }},
		{"Bytes", func(rows pgx.Rows, ev *Event) error { return rows.Scan((*[]byte)(&ev.Payload)) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var ev Event
			b.ReportAllocs()
			for n := 0; n < b.N; {
				rows, err := pool.Query(ctx, query)
				if err != nil {
					b.Fatal(err)
				}
				for rows.Next() && n < b.N {
					if err := tc.scan(rows, &ev); err != nil {
						b.Fatal(err)
					}
					n++
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkJSONHandler: the cost of JSONHandler decoding an event's payload
// into a struct before calling the function, per event.
func BenchmarkJSONHandler(b *testing.B) {
	type payload struct {
		Producer int    `json:"producer"`
		Seq      int64  `json:"seq"`
		Name     string `json:"name"`
	}
	var sum int64
	h := JSONHandler(func(_ context.Context, _ pgx.Tx, _ *Event, p payload) error {
		sum += p.Seq
		return nil
	})
	ev := &Event{Offset: 1, HostID: "host-1", EventType: "bench", Payload: []byte(`{"producer":3,"seq":12345,"name":"bench event"}`)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := h.Handle(ctx, nil, ev); err != nil {
			b.Fatal(err)
		}
	}
	if sum == 0 {
		b.Fatal("handler not called")
	}
}

// BenchmarkLogHandler: the cost of the built-in log handler encoding an
// event as a JSON line, per event (written to io.Discard).
func BenchmarkLogHandler(b *testing.B) {
	h := LogHandler(io.Discard)
	ev := &Event{Offset: 1, TopicID: 1, PartitionID: 3, EventID: "0b7c6f0e-8f1a-4c8e-9d55-3f1c2a9b7e01",
		HostID: "host-1", UserID: "u", TransactionID: 42, EventType: "bench",
		Payload: []byte(`{"producer":3,"seq":12345,"name":"bench event"}`), CreatedAt: time.Now()}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := h.Handle(ctx, nil, ev); err != nil {
			b.Fatal(err)
		}
	}
}
