package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/metrics"
	"github.com/pgevents/pgevents/schema"
)

const partitions = 4

// recordingHandlers record each event in the handled table, and fail
// permanently on events of type "bad", which dead-letters their unit.
func recordingHandlers() *pgevents.Handlers {
	hs := &pgevents.Handlers{}
	hs.HandleAll(pgevents.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
		if ev.EventType == "bad" {
			return pgevents.Permanent(errors.New("bad event"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO handled (c_offset, host_id, partition_id, transaction_id) VALUES ($1, $2, $3, $4)`,
			ev.Offset, ev.HostID, ev.PartitionID, ev.TransactionID)
		return err
	}))
	return hs
}

// appendWorkload appends n producer transactions of 1-6 events over 20
// hosts; every seventh transaction carries a "bad" event. It returns the
// number of events appended.
func appendWorkload(t *testing.T, pool *pgxpool.Pool, seed uint64, n int) int {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	total := 0
	for i := range n {
		var evs []pgevents.Event
		for k := range 1 + rng.IntN(6) {
			typ := "ok"
			if i%7 == 3 && k == 0 {
				typ = "bad"
			}
			evs = append(evs, pgevents.Event{HostID: fmt.Sprintf("h%d", rng.IntN(20)), EventType: typ, Payload: []byte(`{}`)})
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := pgevents.Append(ctx, tx, evs...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		total += len(evs)
	}
	return total
}

// caughtUp reports whether group has handled every event of topic 1.
func caughtUp(t *testing.T, pool *pgxpool.Pool, group string) bool {
	return eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t m
		JOIN consumer_offsets o ON o.group_id = $1 AND o.topic_id = m.topic_id AND o.partition_id = m.partition_id
		WHERE m.topic_id = 1 AND m.c_offset >= o.next_offset`, group) == 0 &&
		eventtest.QueryInt(t, pool, `SELECT count(*) FROM consumer_offsets WHERE group_id = $1`, group) == partitions
}

// TestMetricsMatchDatabase runs a known workload through a consumer whose
// Observer is a Metrics, scrapes /metrics over HTTP, and checks every
// metric against what SQL says is true: while caught up, then with a lag.
func TestMetricsMatchDatabase(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, partitions)
	eventtest.Exec(t, pool, eventtest.HandledTable)
	all := []int{0, 1, 2, 3}
	m, err := metrics.New(metrics.Options{Group: "g", Partitions: all, DB: pool, LagCacheTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c, stop := runConsumer(t, pool, pgevents.Config{GroupID: "g", TotalPartitions: partitions, BatchSize: 10,
		WaitPeriod: time.Second, Handlers: recordingHandlers(), Observer: m})
	m.SetPartitionsOwnedFunc(func() int { return len(c.Partitions()) - int(c.Stats().Halts) })
	m.SetListenerConnectedFunc(c.Ready)
	base := startServer(t, metrics.ServerConfig{Metrics: m.Handler(), DB: pool, Ready: c.Ready})

	total := appendWorkload(t, pool, 1, 60)
	pgtest.WaitFor(t, 30*time.Second, "group g caught up", func() bool { return caughtUp(t, pool, "g") })

	// The observer counts a batch once its COMMIT has returned: the
	// positions can say caught up a moment before the counters do (a
	// loaded run of the suite scraped 38 of 43 handled).
	var f families
	handledNow := eventtest.QueryInt(t, pool, `SELECT count(*) FROM handled`)
	pgtest.WaitFor(t, 10*time.Second, "the metrics counted every handled event", func() bool {
		f = scrape(t, base)
		n, _ := f.sum("pgevents_events_handled_total", labels{"group": "g", "topic": "1"})
		return int64(n) >= handledNow
	})
	q := func(sql string, args ...any) float64 { return float64(eventtest.QueryInt(t, pool, sql, args...)) }
	g := labels{"group": "g", "topic": "1"}
	handled := q(`SELECT count(*) FROM handled`)
	deadLetters := q(`SELECT count(*) FROM dead_letter_queue`)
	if deadLetters == 0 || handled == 0 {
		t.Fatalf("workload proves nothing: %v handled, %v dead letters", handled, deadLetters)
	}
	// Every event was handled or dead-lettered, nothing else.
	if dl := q(`SELECT coalesce(sum(cardinality(event_ids)), 0) FROM dead_letter_queue`); handled+dl != float64(total) {
		t.Fatalf("%v handled + %v dead-lettered events != %d appended", handled, dl, total)
	}
	for _, p := range all {
		pl := labels{"group": "g", "topic": "1", "partition": part(p)}
		if got, want := f.value(t, "pgevents_events_handled_total", pl), q(`SELECT count(*) FROM handled WHERE partition_id = $1`, p); got != want {
			t.Errorf("partition %d: pgevents_events_handled_total = %v, handled rows = %v", p, got, want)
		}
		want := q(`SELECT count(*) FROM dead_letter_queue WHERE partition_id = $1`, p)
		if got := f.value(t, "pgevents_dead_letters_total", pl); got != want {
			t.Errorf("partition %d: pgevents_dead_letters_total = %v, dead_letter_queue rows = %v", p, got, want)
		}
		if got := f.value(t, "pgevents_dead_letters_open", pl); got != want {
			t.Errorf("partition %d: pgevents_dead_letters_open = %v, dead_letter_queue rows = %v", p, got, want)
		}
		if got := f.value(t, "pgevents_consumer_lag_events", pl); got != 0 {
			t.Errorf("partition %d: caught up but pgevents_consumer_lag_events = %v", p, got)
		}
		if got := f.value(t, "pgevents_consumer_lag_seconds", pl); got != 0 {
			t.Errorf("partition %d: caught up but pgevents_consumer_lag_seconds = %v", p, got)
		}
		if got, want := f.value(t, "pgevents_consumer_next_offset", pl),
			q(`SELECT next_offset FROM consumer_offsets WHERE group_id = 'g' AND partition_id = $1`, p); got != want {
			t.Errorf("partition %d: pgevents_consumer_next_offset = %v, consumer_offsets says %v", p, got, want)
		}
		if got, want := f.value(t, "pgevents_log_end_offset", pl),
			q(`SELECT max(c_offset) FROM outbox_message_t WHERE partition_id = $1`, p); got != want {
			t.Errorf("partition %d: pgevents_log_end_offset = %v, max(c_offset) = %v", p, got, want)
		}
		if got := f.value(t, "pgevents_partition_halted", pl); got != 0 {
			t.Errorf("partition %d: pgevents_partition_halted = %v", p, got)
		}
	}
	// A dead-lettered unit failed permanently once before it was
	// dead-lettered, in a rolled-back attempt (counted) or, once the
	// partition's attempts are guarded, in the attempt that dead-lettered
	// it (not a retry): at least one rolled-back attempt, at most one per
	// dead letter.
	if got, _ := f.sum("pgevents_retries_total", labels{"group": "g", "class": "permanent"}); got < 1 || got > deadLetters {
		t.Errorf("pgevents_retries_total{class=permanent} = %v, dead letters = %v: want 1 to one per dead letter", got, deadLetters)
	}
	// Every offset went through exactly one committed batch.
	if got := f.histogramSum(t, "pgevents_batch_size", g); got != float64(total) {
		t.Errorf("sum of pgevents_batch_size = %v, events appended = %d", got, total)
	}
	batches := f.value(t, "pgevents_batch_size", g)
	if got := f.value(t, "pgevents_handler_duration_seconds", g); got != batches {
		t.Errorf("pgevents_handler_duration_seconds has %v samples, %v batches", got, batches)
	}
	// One end-to-end sample per handled event (no batch reaches 1024).
	if got := f.value(t, "pgevents_end_to_end_latency_seconds", g); got != handled {
		t.Errorf("pgevents_end_to_end_latency_seconds has %v samples, %v events handled", got, handled)
	}
	if e2e := f.histogramSum(t, "pgevents_end_to_end_latency_seconds", g); e2e <= 0 || e2e/handled > 30 {
		t.Errorf("mean end-to-end latency %v s is not plausible", e2e/handled)
	}
	if got, _ := f.sum("pgevents_wakeups_total", g); got == 0 {
		t.Error("no wake-ups counted")
	}
	if got := f.value(t, "pgevents_listener_connects_total", g); got != 1 {
		t.Errorf("pgevents_listener_connects_total = %v, want 1", got)
	}
	if got := f.value(t, "pgevents_listener_reconnects_total", g); got != 0 {
		t.Errorf("pgevents_listener_reconnects_total = %v, want 0", got)
	}
	if got := f.value(t, "pgevents_listener_connected", g); got != 1 {
		t.Errorf("pgevents_listener_connected = %v, want 1", got)
	}
	if got := f.value(t, "pgevents_partitions_owned", g); got != partitions {
		t.Errorf("pgevents_partitions_owned = %v, want %d", got, partitions)
	}
	if got := f.value(t, "pgevents_lag_query_up", g); got != 1 {
		t.Errorf("pgevents_lag_query_up = %v", got)
	}
	if got := f.value(t, "pgevents_notification_queue_usage", nil); got < 0 || got > 0.1 {
		t.Errorf("pgevents_notification_queue_usage = %v", got)
	}
	if _, ok := f["go_goroutines"]; !ok {
		t.Error("Go runtime metrics absent")
	}

	// A lag: events appended while the consumer is stopped.
	stop()
	appendWorkload(t, pool, 2, 25)
	f = scrape(t, base)
	lagging := 0
	for _, p := range all {
		pl := labels{"group": "g", "topic": "1", "partition": part(p)}
		want := q(`SELECT count(*) FROM outbox_message_t m JOIN consumer_offsets o ON o.group_id = 'g'
			AND o.topic_id = m.topic_id AND o.partition_id = m.partition_id
			WHERE m.topic_id = 1 AND m.partition_id = $1 AND m.c_offset >= o.next_offset`, p)
		if got := f.value(t, "pgevents_consumer_lag_events", pl); got != want {
			t.Errorf("partition %d: pgevents_consumer_lag_events = %v, events at or after next_offset = %v", p, got, want)
		}
		if got := f.value(t, "pgevents_consumer_lag_events_capped", pl); got != 0 {
			t.Errorf("partition %d: pgevents_consumer_lag_events_capped = %v", p, got)
		}
		secs := f.value(t, "pgevents_consumer_lag_seconds", pl)
		switch {
		case want > 0 && (secs <= 0 || secs > 60):
			t.Errorf("partition %d: %v events behind but pgevents_consumer_lag_seconds = %v", p, want, secs)
		case want == 0 && secs != 0:
			t.Errorf("partition %d: caught up but pgevents_consumer_lag_seconds = %v", p, secs)
		}
		if want > 0 {
			lagging++
		}
	}
	if lagging == 0 {
		t.Fatal("no partition lags; the test proves nothing")
	}
	if got := f.value(t, "pgevents_consumer_lag_events_cap", nil); got != metrics.DefaultLagCap {
		t.Errorf("pgevents_consumer_lag_events_cap = %v", got)
	}
}

// TestLagCapAndOtherGroups checks the cap on the lag count, and the state
// of a group that has positions but does not run, through ReadState and a
// Metrics of that group.
func TestLagCapAndOtherGroups(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, partitions)
	ctx := context.Background()
	if err := store.Init(ctx, pool, "idle", 1, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := store.Init(ctx, pool, "half", 1, []int{1}); err != nil {
		t.Fatal(err)
	}
	appendWorkload(t, pool, 3, 40)
	counts := map[int]int64{}
	for p := range partitions {
		counts[p] = eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE partition_id = $1`, p)
	}
	if err := store.Halt(ctx, pool, "idle", 1, 2, 5, "stopped by the test"); err != nil {
		t.Fatal(err)
	}

	const lagCap = 3
	st, err := metrics.ReadState(ctx, pool, "", 1, lagCap)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Partitions) != 2*partitions {
		t.Fatalf("%d rows, want %d (2 groups × %d partitions)", len(st.Partitions), 2*partitions, partitions)
	}
	for _, ps := range st.Partitions {
		switch {
		case ps.Group == "half" && ps.Partition != 1:
			if ps.HasPosition() || ps.LagEvents != 0 {
				t.Errorf("%+v: want no position", ps)
			}
		case ps.HasPosition():
			want := min(counts[ps.Partition], lagCap)
			if ps.LagEvents != want || ps.LagCapped != (counts[ps.Partition] >= lagCap) {
				t.Errorf("%s/%d: lag %d capped %v, want %d of %d", ps.Group, ps.Partition, ps.LagEvents, ps.LagCapped, want, counts[ps.Partition])
			}
			if counts[ps.Partition] > 0 && ps.LagSeconds <= 0 {
				t.Errorf("%s/%d: lag seconds %v", ps.Group, ps.Partition, ps.LagSeconds)
			}
		default:
			t.Errorf("%+v: want a position", ps)
		}
		halted := ps.Group == "idle" && ps.Partition == 2
		if (ps.Halt != nil) != halted || halted && (ps.Halt.Offset != 5 || ps.Halt.Reason != "stopped by the test") {
			t.Errorf("%s/%d: halt %+v", ps.Group, ps.Partition, ps.Halt)
		}
	}

	m, err := metrics.New(metrics.Options{Group: "idle", DB: pool, LagCap: lagCap, NoRuntimeMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	f := gather(t, m)
	for p := range partitions {
		pl := labels{"group": "idle", "partition": part(p)}
		if got := f.value(t, "pgevents_consumer_lag_events", pl); got != float64(min(counts[p], lagCap)) {
			t.Errorf("partition %d: pgevents_consumer_lag_events = %v", p, got)
		}
		if got := f.value(t, "pgevents_consumer_lag_events_capped", pl); got != b2f(counts[p] >= lagCap) {
			t.Errorf("partition %d: pgevents_consumer_lag_events_capped = %v", p, got)
		}
		if got := f.value(t, "pgevents_partition_halted", pl); got != b2f(p == 2) {
			t.Errorf("partition %d: pgevents_partition_halted = %v", p, got)
		}
	}
	if _, ok := f.sum("pgevents_consumer_lag_events", labels{"group": "half"}); ok {
		t.Error("the metrics of group idle report group half")
	}
	if _, ok := f["go_goroutines"]; ok {
		t.Error("NoRuntimeMetrics: Go runtime metrics present")
	}
	if _, ok := f["pgevents_sequencer_staged_events"]; ok || st.Sequencer != nil {
		t.Error("a topic that is not sequenced has sequencer metrics")
	}
}

// TestSequencerMetrics: a sequenced topic whose producers committed events
// that no sequencer moved into the log. pgevents_sequencer_staged_events
// counts them, pgevents_sequencer_last_tick_age_seconds grows, and each
// partition's lag counts the events staged for it, with their age (the
// lag was 0). Once a tick moved them, nothing is staged, the last tick is
// recent, and the lag is the same events, in the log. The staging tables
// are read through their xid index, also with a generic plan, and the
// count stops at the cap.
func TestSequencerMetrics(t *testing.T) {
	t.Parallel()
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: partitions, Scope: schema.ScopeSequenced})
	ctx := pgtest.Context(context.Background())
	if err := store.Init(ctx, pool, "g", 1, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	staged := appendWorkload(t, pool, 5, 60)
	perPartition := func(table string) map[int]int64 {
		out := map[int]int64{}
		for p := range partitions {
			out[p] = eventtest.QueryInt(t, pool, `SELECT count(*) FROM `+table+` WHERE event_partition(host_id, 4) = $1`, p)
		}
		return out
	}
	scrape := func(lagCap int64) families {
		m, err := metrics.New(metrics.Options{Group: "g", DB: pool, Schema: pgtest.Schema(), LagCap: lagCap, NoRuntimeMetrics: true})
		if err != nil {
			t.Fatal(err)
		}
		return gather(t, m)
	}
	check := func(f families, want map[int]int64, stagedWant int64) {
		t.Helper()
		gl := labels{"group": "g"}
		if got := f.value(t, "pgevents_sequencer_staged_events", gl); got != float64(stagedWant) {
			t.Errorf("pgevents_sequencer_staged_events = %v, want %d", got, stagedWant)
		}
		for p := range partitions {
			pl := labels{"group": "g", "partition": part(p)}
			if got := f.value(t, "pgevents_consumer_lag_events", pl); got != float64(want[p]) {
				t.Errorf("partition %d: pgevents_consumer_lag_events = %v, want %d", p, got, want[p])
			}
			if got := f.value(t, "pgevents_consumer_lag_seconds", pl); want[p] > 0 && got <= 0 {
				t.Errorf("partition %d: pgevents_consumer_lag_seconds = %v with %d events waiting", p, got, want[p])
			}
		}
	}
	want := perPartition("staged_events")
	f := scrape(0)
	check(f, want, int64(staged))
	firstAge := f.value(t, "pgevents_sequencer_last_tick_age_seconds", labels{"group": "g"})
	if firstAge <= 0 {
		t.Errorf("pgevents_sequencer_last_tick_age_seconds = %v before any tick, want the topic's age", firstAge)
	}
	// The cap: counting stops there.
	f = scrape(5)
	if got := f.value(t, "pgevents_sequencer_staged_events", labels{"group": "g"}); got != 5 {
		t.Errorf("pgevents_sequencer_staged_events = %v with the cap at 5", got)
	}
	if st, err := metrics.ReadState(ctx, pool, "g", 1, 5); err != nil || st.Sequencer == nil || !st.Sequencer.StagedCapped {
		t.Errorf("ReadState with the cap at 5: %+v, %v; want the staged count capped", st.Sequencer, err)
	}

	// A tick moves them into the log: nothing staged, a recent tick, the
	// same lag.
	var moved int
	if err := pool.QueryRow(ctx, `SELECT sequence_tick(1)`).Scan(&moved); err != nil || moved != staged {
		t.Fatalf("tick: %d events, %v; want %d", moved, err, staged)
	}
	f = scrape(0)
	check(f, perPartition("outbox_message_t"), 0)
	if age := f.value(t, "pgevents_sequencer_last_tick_age_seconds", labels{"group": "g"}); age >= firstAge {
		t.Errorf("pgevents_sequencer_last_tick_age_seconds = %v after a tick, want less than %v", age, firstAge)
	}
	// The staging tables through their index, whatever the plan, when
	// they hold many events sequenced and a few not.
	for range 4 {
		eventtest.Exec(t, pool, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h' || g, 'event_type', 't'))
			FROM generate_series(1, 5000) g))`)
	}
	eventtest.Exec(t, pool, `SELECT sequence_tick(1)`)
	appendWorkload(t, pool, 6, 10)
	eventtest.Exec(t, pool, `ANALYZE`)
	for mode, plan := range statePlans(t, pool) {
		if regexp.MustCompile(`(Seq|Bitmap Heap) Scan on staged_events_1_0`).MatchString(plan) {
			t.Errorf("%s: the state statement scans the staging table:\n%s", mode, plan)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// gather collects m's registry without HTTP.
func gather(t *testing.T, m *metrics.Metrics) families {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	f := families{}
	for _, fam := range fams {
		f[fam.GetName()] = fam
	}
	return f
}

// TestListenerReconnect kills the listener's connection: the reconnect
// shows in the metrics, and /readyz answers 200 again.
func TestListenerReconnect(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, partitions)
	eventtest.Exec(t, pool, eventtest.HandledTable)
	m, err := metrics.New(metrics.Options{Group: "g", DB: pool, NoRuntimeMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := runConsumer(t, pool, pgevents.Config{GroupID: "g", TotalPartitions: partitions,
		Handlers: recordingHandlers(), Observer: m})
	m.SetListenerConnectedFunc(c.Ready)
	base := startServer(t, metrics.ServerConfig{Metrics: m.Handler(), DB: pool, Ready: c.Ready})
	g := labels{"group": "g", "topic": "1"}

	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before: %d %s", code, body)
	}
	if got := scrape(t, base).value(t, "pgevents_listener_reconnects_total", g); got != 0 {
		t.Fatalf("pgevents_listener_reconnects_total = %v before any reconnect", got)
	}
	killed := eventtest.QueryInt(t, pool, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'pgevents-listener' AND datname = current_database()) k`)
	if killed != 1 {
		t.Fatalf("%d listener connections terminated, want 1", killed)
	}
	pgtest.WaitFor(t, 20*time.Second, "the reconnect counted", func() bool {
		return scrape(t, base).value(t, "pgevents_listener_reconnects_total", g) == 1
	})
	pgtest.WaitFor(t, 20*time.Second, "/readyz 200 again", func() bool {
		code, _ := get(t, base+"/readyz")
		return code == http.StatusOK
	})
	f := scrape(t, base)
	if got := f.value(t, "pgevents_listener_connects_total", g); got != 2 {
		t.Errorf("pgevents_listener_connects_total = %v, want 2", got)
	}
	if got := f.value(t, "pgevents_listener_connected", g); got != 1 {
		t.Errorf("pgevents_listener_connected = %v, want 1", got)
	}
	if got := f.value(t, "pgevents_wakeups_total", labels{"group": "g", "source": "reconnect"}); got != 0 {
		// Nothing to handle: the poll after the reconnect wakes no one.
		t.Errorf("pgevents_wakeups_total{source=reconnect} = %v with an empty log", got)
	}

	// Events committed after the reconnect still flow.
	appendWorkload(t, pool, 4, 5)
	pgtest.WaitFor(t, 20*time.Second, "caught up after the reconnect", func() bool { return caughtUp(t, pool, "g") })
}

// TestReadyz answers 503 naming what is wrong: the listener, or the
// database.
func TestReadyz(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	var mu sync.Mutex
	ready := false
	isReady := func() bool { mu.Lock(); defer mu.Unlock(); return ready }
	base := startServer(t, metrics.ServerConfig{DB: pool, Ready: isReady})

	code, body := get(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "listener") {
		t.Fatalf("/readyz with the listener down: %d %q", code, body)
	}
	mu.Lock()
	ready = true
	mu.Unlock()
	if code, body := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz: %d %q", code, body)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	if code, _ := get(t, base+"/metrics"); code != http.StatusNotFound {
		t.Fatalf("/metrics without a Metrics handler: %d, want 404", code)
	}
	if code, _ := get(t, base+"/debug/pprof/"); code != http.StatusNotFound {
		t.Fatalf("/debug/pprof/ without Pprof: %d, want 404", code)
	}

	// A database that does not answer within the timeout.
	slow := startServer(t, metrics.ServerConfig{DB: slowDB{pool}, Ready: isReady, ReadyTimeout: 50 * time.Millisecond})
	code, body = get(t, slow+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "database") {
		t.Fatalf("/readyz with a slow database: %d %q", code, body)
	}
	// /healthz does not depend on the database.
	if code, _ := get(t, slow+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
}

// TestReadyzEveryDatabase: a process on several databases is ready only
// when every one answers; the body names the one that does not.
func TestReadyzEveryDatabase(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	other := newTopic(t, 1)
	ready := func() bool { return true }
	both := startServer(t, metrics.ServerConfig{DB: pool, MoreDBs: []schema.DB{other}, Ready: ready})
	if code, body := get(t, both+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with both databases answering: %d %q", code, body)
	}
	second := startServer(t, metrics.ServerConfig{DB: pool, MoreDBs: []schema.DB{slowDB{other}}, Ready: ready, ReadyTimeout: 50 * time.Millisecond})
	if code, body := get(t, second+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "database 2 of 2") {
		t.Fatalf("/readyz with the second database silent: %d %q, want 503 naming database 2 of 2", code, body)
	}
}

// slowDB answers every statement after 2 s.
type slowDB struct{ *pgxpool.Pool }

func (d slowDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return d.Pool.QueryRow(ctx, "SELECT 1 FROM pg_sleep(2)")
}

func TestPprof(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	base := startServer(t, metrics.ServerConfig{DB: pool, Pprof: true})
	if code, body := get(t, base+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/: %d\n%s", code, body)
	}
}

// countingDB counts the statements run through it.
type countingDB struct {
	*pgxpool.Pool
	mu sync.Mutex
	n  int
}

func (d *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.mu.Lock()
	d.n++
	d.mu.Unlock()
	return d.Pool.Query(ctx, sql, args...)
}

// SendBatch counts a batch as one statement: a reading is a batch (JIT
// off, then the state).
func (d *countingDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	d.mu.Lock()
	d.n++
	d.mu.Unlock()
	return d.Pool.SendBatch(ctx, b)
}

func (d *countingDB) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// TestLagReadingsAreShared: concurrent scrapes within the cache's TTL cost
// one statement.
func TestLagReadingsAreShared(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, partitions)
	if err := store.Init(context.Background(), pool, "g", 1, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	db := &countingDB{Pool: pool}
	m, err := metrics.New(metrics.Options{Group: "g", DB: db, LagCacheTTL: time.Minute, NoRuntimeMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	base := startServer(t, metrics.ServerConfig{Metrics: m.Handler(), DB: pool})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			resp, err := http.Get(base + "/metrics")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	scrape(t, base)
	if n := db.count(); n != 1 {
		t.Fatalf("9 scrapes ran %d statements, want 1", n)
	}
}

// failingDB fails every statement.
type failingDB struct{ *pgxpool.Pool }

func (failingDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("database unreachable")
}

func (failingDB) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	return failedBatch{errors.New("database unreachable")}
}

// failedBatch is a batch whose every result is err.
type failedBatch struct{ err error }

func (f failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, f.err }
func (f failedBatch) Query() (pgx.Rows, error)         { return nil, f.err }
func (f failedBatch) QueryRow() pgx.Row                { return failedRow(f) }
func (f failedBatch) Close() error                     { return f.err }
func (f failedBatch) Tx() pgx.Tx                       { return nil }

// failedRow is a row whose Scan fails with err.
type failedRow struct{ err error }

func (f failedRow) Scan(...any) error { return f.err }

// TestLagFailureKeepsTheScrape: when the database cannot be read, the lag
// metrics are absent, pgevents_lag_query_up is 0, and the rest is served.
func TestLagFailureKeepsTheScrape(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	for name, db := range map[string]schema.DB{"error": failingDB{pool}, "timeout": slowQuerier{pool}} {
		m, err := metrics.New(metrics.Options{Group: "g", DB: db, Partitions: []int{0}, LagTimeout: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		base := startServer(t, metrics.ServerConfig{Metrics: m.Handler(), DB: pool})
		f := scrape(t, base)
		if got := f.value(t, "pgevents_lag_query_up", labels{"group": "g"}); got != 0 {
			t.Errorf("%s: pgevents_lag_query_up = %v, want 0", name, got)
		}
		if _, ok := f["pgevents_consumer_lag_events"]; ok {
			t.Errorf("%s: lag metrics present after a failed reading", name)
		}
		if _, ok := f["pgevents_events_handled_total"]; !ok {
			t.Errorf("%s: the consumer's metrics are missing from the scrape", name)
		}
	}
}

// slowQuerier's statements take longer than any test timeout.
type slowQuerier struct{ *pgxpool.Pool }

func (d slowQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.Pool.Query(ctx, "SELECT pg_sleep(10)")
}

func (d slowQuerier) SendBatch(ctx context.Context, _ *pgx.Batch) pgx.BatchResults {
	var b pgx.Batch
	b.Queue("SELECT pg_sleep(10)")
	b.Queue("SELECT pg_sleep(10)")
	return d.Pool.SendBatch(ctx, &b)
}

// TestServerShutdown: Run returns nil soon after its context ends, and the
// port is closed.
func TestServerShutdown(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	srv, err := metrics.NewServer(metrics.ServerConfig{Addr: "127.0.0.1:0", DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.NewServer(metrics.ServerConfig{Addr: srv.Addr(), DB: pool}); err == nil {
		t.Fatal("a second server on the same address started")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	base := "http://" + srv.Addr()
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of cancel")
	}
	if resp, err := http.Get(base + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("server still answers after shutdown")
	}
}

func TestNewRequiresGroup(t *testing.T) {
	t.Parallel()
	if _, err := metrics.New(metrics.Options{}); err == nil {
		t.Fatal("New without a group succeeded")
	}
}

// TestPartitionFailingGauges: pgevents_partition_failing_batches counts
// the batches of a partition that failed since its last commit, and
// pgevents_partition_failing_since_seconds says when the first failed;
// both go back to 0 at the next commit.
func TestPartitionFailingGauges(t *testing.T) {
	m, err := metrics.New(metrics.Options{Group: "g", Partitions: []int{0, 1}, NoRuntimeMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	before := float64(time.Now().Unix())
	m.BatchFailed(1, pgevents.ClassTransient)
	m.BatchFailed(1, pgevents.ClassTransient)
	f := scrape(t, srv.URL)
	if got, _ := f.sum("pgevents_partition_failing_batches", labels{"partition": "1"}); got != 2 {
		t.Errorf("failing batches of partition 1 = %v, want 2", got)
	}
	if got, _ := f.sum("pgevents_partition_failing_since_seconds", labels{"partition": "1"}); got < before {
		t.Errorf("failing since = %v, want at least %v", got, before)
	}
	if got, _ := f.sum("pgevents_partition_failing_batches", labels{"partition": "0"}); got != 0 {
		t.Errorf("failing batches of partition 0 = %v, want 0", got)
	}
	m.BatchCommitted(pgevents.BatchStats{Group: "g", Topic: 1, Partition: 1, Events: 1, Handled: 1})
	f = scrape(t, srv.URL)
	if got, _ := f.sum("pgevents_partition_failing_batches", labels{"partition": "1"}); got != 0 {
		t.Errorf("failing batches after a commit = %v, want 0", got)
	}
	if got, _ := f.sum("pgevents_partition_failing_since_seconds", labels{"partition": "1"}); got != 0 {
		t.Errorf("failing since after a commit = %v, want 0", got)
	}
}
