package pgevents

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
)

// TestMaintenanceSamplesOncePerPeriod: three consumers (of three groups,
// each on a pool of its own, as three processes) run maintenance every
// 20 ms while events flow, across at least one period's end. Each period
// holds one sample of the topic, written by one of them (its maintenance
// session's name), with the row of every group read by the same statement;
// the events appended in the samples add up to those the log received
// between the first and the last.
func TestMaintenanceSamplesOncePerPeriod(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 2)
	ctx := pgtest.Context(context.Background())
	mustExec(t, pool, handledTable)
	replicas := map[string]bool{}
	for _, g := range []string{"a", "b", "c"} {
		hs := &Handlers{}
		hs.HandleAll(SQLHandler(g, recordSQL))
		c := startConsumer(t, pool, Config{GroupID: g, TotalPartitions: 2, Handlers: hs, MaintenanceInterval: 20 * time.Millisecond})
		replicas[store.RoleMaintenance.ApplicationName(c.ReplicaID())] = true
	}
	// Events flow until three periods have their sample.
	// Every group's subscription is committed by now. A sample of a period
	// that starts after this clock reading took its snapshot after it
	// (created_at, its transaction's start, would not do: a sample whose
	// snapshot preceded the subscription's commit may be taken after it).
	var all time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp() FROM subscriptions HAVING count(*) = 3`).Scan(&all); err != nil {
		t.Fatalf("the three groups' subscriptions: %v", err)
	}
	start := time.Now()
	for i := 0; queryInt(t, pool, `SELECT count(*) FROM topic_samples`) < 3; i++ {
		if time.Since(start) > 3*store.SamplePeriod {
			t.Fatalf("%d samples after %s", queryInt(t, pool, `SELECT count(*) FROM topic_samples`), time.Since(start))
		}
		appendTx(t, pool, ev(fmt.Sprintf("h%d", i%5), "t", `{}`))
		time.Sleep(50 * time.Millisecond)
	}
	rows, err := pool.Query(ctx, `SELECT s.bucket, s.taken_at, s.writer, count(g.*), count(g.*) FILTER (WHERE g.taken_at = s.taken_at)
		FROM topic_samples s LEFT JOIN group_samples g USING (topic_id, bucket) GROUP BY s.bucket, s.taken_at, s.writer ORDER BY s.bucket`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var prev time.Time
	for rows.Next() {
		var (
			bucket, at    time.Time
			writer        string
			groups, atOne int
		)
		if err := rows.Scan(&bucket, &at, &writer, &groups, &atOne); err != nil {
			t.Fatal(err)
		}
		if !replicas[writer] {
			t.Errorf("period %v written by %q, not by a consumer's maintenance (%v)", bucket, writer, replicas)
		}
		if want := 3; bucket.After(all) && (groups != want || atOne != want) || groups != atOne {
			t.Errorf("period %v: %d group rows, %d read with the topic's; want 3 and 3", bucket, groups, atOne)
		}
		if !prev.IsZero() && bucket.Sub(prev) < store.SamplePeriod {
			t.Errorf("periods %v and %v are closer than %s", prev, bucket, store.SamplePeriod)
		}
		prev = bucket
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The events appended since the first sample, as the samples count
	// them and as the log holds them between the first sample's heads and
	// the last's, partition by partition (offsets grow within one).
	var counted, logged int64
	if err := pool.QueryRow(ctx, `WITH f AS (SELECT heads FROM topic_samples ORDER BY bucket LIMIT 1),
		l AS (SELECT heads FROM topic_samples ORDER BY bucket DESC LIMIT 1)
		SELECT (SELECT sum(appended) FROM topic_samples)::bigint,
		       (SELECT count(*) FROM outbox_message_t m, f, l
		         WHERE m.c_offset > coalesce(f.heads[m.partition_id + 1], 0) AND m.c_offset <= l.heads[m.partition_id + 1])`).Scan(&counted, &logged); err != nil {
		t.Fatal(err)
	}
	if counted != logged || counted == 0 {
		t.Errorf("the samples count %d events appended, the log holds %d between their heads", counted, logged)
	}
}

// TestSamplesBoundedOverADay: a day of samples (every period of the 24
// hours before now, for the topic and three groups) is pruned by one
// maintenance pass to the last store.SampleKeep, plus the pass's own.
func TestSamplesBoundedOverADay(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 2)
	ctx := pgtest.Context(context.Background())
	mustExec(t, pool, `INSERT INTO topic_samples (topic_id, bucket, taken_at, heads, writer)
		SELECT 1, b, b, '{}', 'day' FROM generate_series(date_bin('10 s', clock_timestamp(), timestamptz '2000-01-01 00:00:00+00') - interval '24 hours',
		                                                  clock_timestamp() - interval '10 s', interval '10 s') b`)
	mustExec(t, pool, `INSERT INTO group_samples (topic_id, bucket, group_id, taken_at, lag, lag_capped, lag_seconds, dead_letters,
		positions, part_handled, part_lag, part_lag_seconds, dead_letters_seen)
		SELECT 1, s.bucket, g, s.taken_at, 0, false, 0, 0, '{}', '{}', '{}', '{}', '{}' FROM topic_samples s, unnest(ARRAY['a', 'b', 'c']) g`)
	day := queryInt(t, pool, `SELECT count(*) FROM topic_samples`)
	if day < 8639 {
		t.Fatalf("%d samples in the simulated day", day)
	}
	m, err := Maintain(ctx, pool, 1, nil)
	if err != nil || !m.Ran {
		t.Fatalf("Maintain = %+v, %v", m, err)
	}
	bound := int64(store.SampleKeep/store.SamplePeriod) + 2 // the kept periods, both ends, and the pass's own
	topics, groups := queryInt(t, pool, `SELECT count(*) FROM topic_samples`), queryInt(t, pool, `SELECT count(*) FROM group_samples`)
	if topics > bound || groups > 3*bound || topics < bound-3 {
		t.Fatalf("after the pass: %d topic samples and %d group samples of the day's %d; want at most %d and %d (and about %d)",
			topics, groups, day, bound, 3*bound, bound)
	}
	if m.Pruned < 4*(day-bound) {
		t.Errorf("Maintenance.Pruned = %d, want the %d rows older than %s at least", m.Pruned, 4*(day-bound), store.SampleKeep)
	}
	if old := queryInt(t, pool, `SELECT count(*) FROM topic_samples WHERE bucket < clock_timestamp() - $1 * interval '1 ms'`,
		store.SampleKeep.Milliseconds()); old != 0 {
		t.Errorf("%d samples older than %s left", old, store.SampleKeep)
	}
	if !m.Sampled || queryInt(t, pool, `SELECT count(*) FROM topic_samples WHERE writer LIKE 'pgevents maintenance %'`) != 1 {
		t.Errorf("the pass wrote no sample of its own (Sampled %v)", m.Sampled)
	}
}
