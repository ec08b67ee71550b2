package store

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// sampleTopic returns a pool on a fresh database holding topic 1 of 3
// partitions in scope, with group g subscribed at its earliest events.
func sampleTopic(t *testing.T, scope string) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx := pgtest.Context(context.Background())
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 3, Scope: scope})
	if _, _, err := Subscribe(ctx, pool, "g", 1, Start{Kind: "earliest"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	return ctx, pool
}

// sampleNow samples topic 1 in a period of its own (1 ms periods: it
// tries again in the rare case that the previous call's period is not
// over).
func sampleNow(t *testing.T, ctx context.Context, pool *pgxpool.Pool) Sampled {
	t.Helper()
	for range 100 {
		s, err := Sample(ctx, pool, 1, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if s.Wrote {
			return s
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("no sample written in 100 periods of 1 ms")
	return Sampled{}
}

// groupRow is the newest group_samples row of g.
type groupRow struct {
	Seconds                  *float64
	Handled, DeadLettered    *int64
	Lag, DeadLetters         int64
	LagCapped                bool
	LagSeconds               float64
	Positions, PartHandled   []*int64
	PartLag, DeadLettersSeen []int64
	PartLagSeconds           []float64
	TakenAt, TopicTakenAt    time.Time
	Appended                 *int64
	TopicSeconds             *float64
	Writer                   string
}

func newestSample(t *testing.T, ctx context.Context, pool *pgxpool.Pool) groupRow {
	t.Helper()
	var r groupRow
	err := pool.QueryRow(ctx, `SELECT g.seconds, g.handled, g.dead_lettered, g.lag, g.dead_letters, g.lag_capped, g.lag_seconds,
		g.positions, g.part_handled, g.part_lag, g.dead_letters_seen, g.part_lag_seconds, g.taken_at, s.taken_at, s.appended, s.seconds, s.writer
		FROM group_samples g JOIN topic_samples s USING (topic_id, bucket)
		WHERE g.group_id = 'g' ORDER BY g.bucket DESC LIMIT 1`).Scan(&r.Seconds, &r.Handled, &r.DeadLettered, &r.Lag, &r.DeadLetters,
		&r.LagCapped, &r.LagSeconds, &r.Positions, &r.PartHandled, &r.PartLag, &r.DeadLettersSeen, &r.PartLagSeconds,
		&r.TakenAt, &r.TopicTakenAt, &r.Appended, &r.TopicSeconds, &r.Writer)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ptr writes *v, or nil.
func ptr[T any](v *T) string {
	if v == nil {
		return "nil"
	}
	return fmt.Sprint(*v)
}

func qInt(t *testing.T, ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func qExec(t *testing.T, ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestSampleFigures: in both offset scopes, a sample says what the log
// and the group's positions say. The first has no rates (nothing to
// compare with); the next counts the events appended and those the group
// handled between the two (as the log counts them between the positions),
// the lag as the log counts it from the positions, and the dead letters
// written since, even when one was resolved meanwhile.
func TestSampleFigures(t *testing.T) {
	t.Parallel()
	for _, scope := range []string{schema.ScopeTopic, schema.ScopePartition} {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			ctx, pool := sampleTopic(t, scope)
			appendN := func(n, from int) {
				qExec(t, ctx, pool, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h' || (i % 11), 'event_type', 't'))
					FROM generate_series($1::int, $1::int + $2::int - 1) i))`, from, n)
			}
			positions := func() []int64 {
				rows, err := pool.Query(ctx, `SELECT next_offset FROM consumer_offsets WHERE group_id = 'g' ORDER BY partition_id`)
				if err != nil {
					t.Fatal(err)
				}
				out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			lagOf := func(p int, pos int64) int64 {
				return qInt(t, ctx, pool, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1 AND partition_id = $1 AND c_offset >= $2`, p, pos)
			}
			appendN(40, 0)
			s := sampleNow(t, ctx, pool)
			if s.Groups != 1 {
				t.Fatalf("first sample: %+v, want the row of group g", s)
			}
			r := newestSample(t, ctx, pool)
			if r.Seconds != nil || r.Handled != nil || r.DeadLettered != nil || r.Appended != nil || r.TopicSeconds != nil {
				t.Errorf("the first sample has rates: %+v", r)
			}
			if r.Lag != 40 || r.LagCapped || r.LagSeconds <= 0 || !r.TakenAt.Equal(r.TopicTakenAt) {
				t.Errorf("first sample: lag %d (capped %v, %.3fs), want the 40 events with an age; taken at %v and %v", r.Lag, r.LagCapped, r.LagSeconds, r.TakenAt, r.TopicTakenAt)
			}
			before := positions()

			// 25 more events; the group moves to the 8th event of each
			// partition; two dead letters in partition 0.
			appendN(25, 40)
			qExec(t, ctx, pool, `UPDATE consumer_offsets o SET next_offset = (SELECT m.c_offset FROM outbox_message_t m
				WHERE m.topic_id = 1 AND m.partition_id = o.partition_id ORDER BY m.c_offset OFFSET 7 LIMIT 1) WHERE o.group_id = 'g'`)
			addDeadLetter := func(p int) int64 {
				var id int64
				if err := pool.QueryRow(ctx, `INSERT INTO dead_letter_queue (group_id, topic_id, partition_id, first_offset, last_offset,
					transaction_id, event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at)
					VALUES ('g', 1, $1, 1, 1, 1, '{}', '{}', '[]', 'x', 1, now(), now()) RETURNING id`, p).Scan(&id); err != nil {
					t.Fatal(err)
				}
				return id
			}
			first := addDeadLetter(0)
			addDeadLetter(0)
			sampleNow(t, ctx, pool)
			r = newestSample(t, ctx, pool)
			after := positions()
			var handled, lag int64
			for p := range 3 {
				n := qInt(t, ctx, pool, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1 AND partition_id = $1 AND c_offset >= $2 AND c_offset < $3`,
					p, before[p], after[p])
				handled += n
				if r.PartHandled[p] == nil || *r.PartHandled[p] != n {
					t.Errorf("partition %d: handled %s, the log holds %d events between %d and %d", p, ptr(r.PartHandled[p]), n, before[p], after[p])
				}
				if l := lagOf(p, after[p]); r.PartLag[p] != l {
					t.Errorf("partition %d: lag %d, the log holds %d events from %d", p, r.PartLag[p], l, after[p])
				} else {
					lag += l
				}
				if r.Positions[p] == nil || *r.Positions[p] != after[p] {
					t.Errorf("partition %d: position %s, want %d", p, ptr(r.Positions[p]), after[p])
				}
			}
			if r.Handled == nil || *r.Handled != handled || r.Lag != lag {
				t.Errorf("group: handled %s, lag %d; the log says %d and %d", ptr(r.Handled), r.Lag, handled, lag)
			}
			if r.Appended == nil || *r.Appended != 25 {
				t.Errorf("appended %s since the previous sample, want 25", ptr(r.Appended))
			}
			if r.Seconds == nil || r.TopicSeconds == nil || *r.Seconds <= 0 || *r.Seconds != *r.TopicSeconds {
				t.Errorf("seconds since the previous sample: group %s, topic %s", ptr(r.Seconds), ptr(r.TopicSeconds))
			}
			if r.DeadLettered == nil || *r.DeadLettered != 2 || r.DeadLetters != 2 {
				t.Errorf("dead letters: %s new, %d open; want 2 and 2", ptr(r.DeadLettered), r.DeadLetters)
			}

			// One resolved, one more written: one new, two open.
			qExec(t, ctx, pool, `DELETE FROM dead_letter_queue WHERE id = $1`, first)
			addDeadLetter(0)
			sampleNow(t, ctx, pool)
			r = newestSample(t, ctx, pool)
			if r.DeadLettered == nil || *r.DeadLettered != 1 || r.DeadLetters != 2 {
				t.Errorf("after one resolved and one written: %s new, %d open; want 1 and 2", ptr(r.DeadLettered), r.DeadLetters)
			}
			if r.Handled == nil || *r.Handled != 0 || *r.Appended != 0 {
				t.Errorf("nothing moved: handled %s, appended %s", ptr(r.Handled), ptr(r.Appended))
			}

			// More events than a sample counts in each partition: the lag
			// is an estimate from the offsets, and says so (exact under
			// scope partition, where a partition's offsets are consecutive).
			appendN(3600, 100)
			sampleNow(t, ctx, pool)
			r = newestSample(t, ctx, pool)
			lag = 0
			for p := range 3 {
				lag += lagOf(p, after[p])
			}
			if !r.LagCapped || scope == schema.ScopePartition && r.Lag != lag || r.Lag < lag/2 || r.Lag > 2*lag {
				t.Errorf("lag of %d events, more than %d in a partition: sampled %d (capped %v)", lag, SampleLagCap, r.Lag, r.LagCapped)
			}
		})
	}
}

// TestSampleOneWriterPerPeriod: eight sessions sample the topic at once,
// in one period: one writes the topic's row and the groups', all read by
// its statement (the groups' rows were taken when the topic's was), the
// others write nothing and fail nothing.
func TestSampleOneWriterPerPeriod(t *testing.T) {
	t.Parallel()
	ctx, pool := sampleTopic(t, pgtest.Scope())
	for _, g := range []string{"a", "b"} {
		if _, _, err := Subscribe(ctx, pool, g, 1, Start{Kind: "earliest"}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	qExec(t, ctx, pool, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h' || i, 'event_type', 't'))
		FROM generate_series(1, 30) i))`)
	const writers = 8
	conns := make([]*pgx.Conn, writers)
	for i := range conns {
		c, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if n := pgtest.Schema(); n != "" {
			if _, err := c.Exec(ctx, `SELECT set_config('search_path', $1, false)`, pgx.Identifier{n}.Sanitize()+", public"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Exec(ctx, `SELECT set_config('application_name', $1, false)`, fmt.Sprintf("writer %d", i)); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	// An hour's period: every call falls in one (or, across the hour's
	// end, two).
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		mu    sync.Mutex
		wrote int
		errs  []error
	)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			s, err := Sample(ctx, c, 1, time.Hour)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if s.Wrote {
				wrote++
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent samples failed: %v", errs)
	}
	buckets := qInt(t, ctx, pool, `SELECT count(*) FROM topic_samples`)
	if wrote < 1 || wrote > 2 || int64(wrote) != buckets {
		t.Fatalf("%d of %d writers wrote, %d topic rows: want one per period", wrote, writers, buckets)
	}
	rows, err := pool.Query(ctx, `SELECT s.bucket, s.writer, array_agg(g.group_id ORDER BY g.group_id),
		bool_and(g.taken_at = s.taken_at)
		FROM topic_samples s JOIN group_samples g USING (topic_id, bucket) GROUP BY s.bucket, s.writer`)
	if err != nil {
		t.Fatal(err)
	}
	type bucketRow struct {
		Bucket  time.Time
		Writer  string
		Groups  []string
		OneRead bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[bucketRow])
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != buckets {
		t.Fatalf("%d periods with group rows, %d topic rows", len(got), buckets)
	}
	for _, b := range got {
		if !slices.Equal(b.Groups, []string{"a", "b", "g"}) || !b.OneRead {
			t.Errorf("period %v (written by %s): groups %v, all read with the topic's row: %v; want a, b, g, true", b.Bucket, b.Writer, b.Groups, b.OneRead)
		}
	}
	if n := qInt(t, ctx, pool, `SELECT count(*) FROM group_samples`); n != 3*buckets {
		t.Errorf("%d group rows for %d periods of 3 groups", n, buckets)
	}
}

// BenchmarkSample is the cost of one sample (store.Sample, as maintenance
// writes it every SamplePeriod) of a topic of 8 partitions and 100,000
// events with 4 groups, in both offset scopes: groups that keep up (each
// sample finds 1,000 events handled since the previous, 125 per
// partition), and groups behind by more than SampleLagCap in every
// partition (their lag is counted up to the cap, then estimated from the
// offsets). The
// timer covers the sample only; between samples 1,000 events are appended
// and the positions move.
func BenchmarkSample(b *testing.B) {
	for _, scope := range []string{schema.ScopeTopic, schema.ScopePartition} {
		for _, behind := range []bool{false, true} {
			name := scope + "/keeping-up"
			if behind {
				name = scope + "/behind"
			}
			b.Run(name, func(b *testing.B) {
				ctx := pgtest.Context(context.Background())
				pool := pgtest.TopicPoolSpec(b, schema.TopicSpec{ID: 1, Partitions: 8, Scope: scope})
				for _, q := range []string{
					`SELECT count(*) FROM append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h' || i, 'event_type', 't'))
						FROM generate_series(1, 100000) i))`,
					`VACUUM ANALYZE`,
				} {
					if _, err := pool.Exec(ctx, q); err != nil {
						b.Fatal(err)
					}
				}
				for _, g := range []string{"a", "b", "c", "d"} {
					if _, _, err := Subscribe(ctx, pool, g, 1, Start{Kind: "earliest"}, time.Hour); err != nil {
						b.Fatal(err)
					}
				}
				// Between samples: 1,000 events appended, and the groups'
				// positions moved past 125 more events of each partition:
				// to the head (keeping up), or from far behind (behind).
				move := func(k int) {
					b.Helper()
					if _, err := pool.Exec(ctx, `SELECT count(*) FROM append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h' || i, 'event_type', 't'))
						FROM generate_series(1, 1000) i))`); err != nil {
						b.Fatal(err)
					}
					q := `UPDATE consumer_offsets o SET next_offset = (SELECT max(m.c_offset) + 1 FROM outbox_message_t m
						WHERE m.topic_id = 1 AND m.partition_id = o.partition_id)`
					if behind {
						q = `UPDATE consumer_offsets o SET next_offset = (SELECT m.c_offset FROM outbox_message_t m
							WHERE m.topic_id = 1 AND m.partition_id = o.partition_id ORDER BY m.c_offset OFFSET 1000 + 125 * $1::int LIMIT 1)`
					}
					args := []any{}
					if behind {
						args = append(args, k)
					}
					if _, err := pool.Exec(ctx, q, args...); err != nil {
						b.Fatal(err)
					}
				}
				move(0)
				if _, err := Sample(ctx, pool, 1, time.Millisecond); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := range b.N {
					b.StopTimer()
					move(i + 1)
					time.Sleep(time.Millisecond) // a period of its own
					b.StartTimer()
					s, err := Sample(ctx, pool, 1, time.Millisecond)
					if err != nil || !s.Wrote || s.Groups != 4 {
						b.Fatalf("Sample = %+v, %v", s, err)
					}
				}
			})
		}
	}
}

// TestSampleLaterWriterAddsNothing: a writer whose sample of a period
// loses the race to another's does not add to that period what the other
// did not see. Writer A has sampled the period, not committed yet; a
// group subscribes; writer B samples the same period, sees the new group,
// and waits for A's insert. Once A commits, B writes nothing: the period
// holds A's rows only, read by A's statement (not B's row of the new
// group, read later).
func TestSampleLaterWriterAddsNothing(t *testing.T) {
	t.Parallel()
	ctx, pool := sampleTopic(t, pgtest.Scope())
	a, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback(ctx) //nolint:errcheck // committed below
	if s, err := Sample(ctx, a, 1, time.Hour); err != nil || !s.Wrote || s.Groups != 1 {
		t.Fatalf("writer A: %+v, %v", s, err)
	}
	if _, _, err := Subscribe(ctx, pool, "late", 1, Start{Kind: "earliest"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	b, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	var pid int
	if err := b.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	type result struct {
		s   Sampled
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := Sample(ctx, b, 1, time.Hour)
		done <- result{s, err}
	}()
	pgtest.WaitFor(t, 10*time.Second, "writer B waits for A's insert", func() bool {
		return qInt(t, ctx, pool, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid) == 1
	})
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.s.Wrote || r.s.Groups != 0 {
		t.Fatalf("writer B, after A: %+v, %v; want nothing written", r.s, r.err)
	}
	if n := qInt(t, ctx, pool, `SELECT count(*) FROM group_samples WHERE group_id = 'late'`); n != 0 {
		t.Errorf("the period has %d rows of the group only writer B saw", n)
	}
	if n := qInt(t, ctx, pool, `SELECT count(*) FROM group_samples g JOIN topic_samples s USING (topic_id, bucket) WHERE g.taken_at = s.taken_at`); n != 1 {
		t.Errorf("%d rows read with the topic's, want group g's", n)
	}
}
