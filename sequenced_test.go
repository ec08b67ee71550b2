package pgevents

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

var sequencedSeed = flag.Uint64("sequenced.seed", 0, "seed of TestSequencedModel and TestSequencedTicksWakeWorkers (0: drawn)")

// sequencedRand returns the random source of a seeded test of this file,
// and its seed: -sequenced.seed, or one drawn, which it logs with the flag
// that replays it; stream tells the tests' sources apart.
func sequencedRand(t *testing.T, stream uint64) (*rand.Rand, uint64) {
	t.Helper()
	seed := *sequencedSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -sequenced.seed %d)", seed, seed)
	return rand.New(rand.NewPCG(seed, stream)), seed
}

// seqTx is one producer transaction of TestSequencedModel, as the model
// knows it.
type seqTx struct {
	id        int
	hosts     []string // per event, in insert order
	start     int64    // the clock when its first insert began
	committed int64    // the clock when its COMMIT returned; 0 if rolled back
}

// TestSequencedModel: producers append to a sequenced topic from many
// sessions, through Go (Append) and SQL (append_event, append_events), in
// transactions of 1 to 8 events over several hosts, some rolled back, some
// held open a while, while a consumer runs and the sequencer's session is
// killed at random moments (mid-tick, some of them) and taken over. Checked
// against the model, from the log and the handler, while the staging
// tables are rotated every 30 ms:
//   - every committed event is in the log exactly once, nothing of a
//     rolled-back transaction is;
//   - each partition's offsets are 1..n, gapless;
//   - a transaction's events are contiguous in each partition, in insert
//     order, and carry their transaction's id, one per transaction;
//   - causality: an event inserted after another's transaction committed
//     has a later offset when both are in one partition (so a host's
//     events keep the order of their transactions' commits);
//   - the handler saw every event once, in offset order per partition.
//
// The seed is printed; -sequenced.seed replays it.
func TestSequencedModel(t *testing.T) {
	t.Parallel()
	rng, seed := sequencedRand(t, 27)
	const partitions = 4
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: partitions, Scope: schema.ScopeSequenced})
	ctx := pgtest.Context(context.Background())

	var mu sync.Mutex
	handled := map[string]int{}         // per "tx/i", times handled
	lastHandled := map[int]int64{}      // per partition, the last offset handled
	var orderErr atomic.Pointer[string] // first out-of-order handling
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(_ context.Context, _ pgx.Tx, ev *Event) error {
		mu.Lock()
		defer mu.Unlock()
		var p struct{ Tx, I int }
		_ = json.Unmarshal(ev.Payload, &p)
		handled[fmt.Sprintf("%d/%d", p.Tx, p.I)]++
		if ev.Offset <= lastHandled[ev.PartitionID] {
			msg := fmt.Sprintf("partition %d: offset %d handled after %d", ev.PartitionID, ev.Offset, lastHandled[ev.PartitionID])
			orderErr.CompareAndSwap(nil, &msg)
		}
		lastHandled[ev.PartitionID] = ev.Offset
		return nil
	}))
	startConsumer(t, pool, Config{TotalPartitions: partitions, Handlers: hs})

	var clock atomic.Int64
	hosts := 3 + rng.IntN(10)
	producers := 4 + rng.IntN(5)
	perProducer := 30 + rng.IntN(40)
	txs := make([][]*seqTx, producers)
	seeds := make([]uint64, producers)
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	stopKill := make(chan struct{})
	killed := make(chan int, 1)
	go func() { // the sequencer's session, killed at random moments
		krng := rand.New(rand.NewPCG(rng.Uint64(), 1))
		n := 0
		defer func() { killed <- n }()
		for {
			select {
			case <-stopKill:
				return
			case <-time.After(time.Duration(20+krng.IntN(200)) * time.Millisecond):
			}
			var k int
			_ = pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE application_name LIKE 'pgevents sequencer %' AND datname = current_database()`).Scan(&k)
			n += k
		}
	}()
	rotated := make(chan [2]int, 1)
	go func() { // the staging tables rotated far more often than the sequencer does
		tries, n := 0, 0
		defer func() { rotated <- [2]int{n, tries} }()
		for {
			select {
			case <-stopKill:
				return
			case <-time.After(30 * time.Millisecond):
			}
			var ok bool
			if err := pool.QueryRow(ctx, `SELECT rotate_stage(1)`).Scan(&ok); err != nil {
				t.Errorf("rotate_stage: %v", err)
				return
			}
			tries++
			if ok {
				n++
			}
		}
	}()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prng := rand.New(rand.NewPCG(seeds[p], 3))
			for k := range perProducer {
				tx := &seqTx{id: p*10000 + k}
				if err := produceSequenced(ctx, pool, prng, tx, hosts, &clock); err != nil {
					t.Errorf("seed %d: producer %d: %v", seed, p, err)
					return
				}
				txs[p] = append(txs[p], tx)
			}
		}()
	}
	wg.Wait()
	close(stopKill)
	kills := <-killed
	rotations := <-rotated
	if rotations[0] == 0 {
		t.Errorf("seed %d: no rotation of the staging tables in %d tries", seed, rotations[1])
	}
	want := 0
	for _, ts := range txs {
		for _, tx := range ts {
			if tx.committed > 0 {
				want += len(tx.hosts)
			}
		}
	}
	pgtest.WaitFor(t, time.Minute, "every committed event handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) >= want
	})
	checkSequencedLog(t, seed, pool, txs)
	mu.Lock()
	defer mu.Unlock()
	for k, n := range handled {
		if n != 1 {
			t.Errorf("seed %d: event %s handled %d times", seed, k, n)
		}
	}
	if len(handled) != want {
		t.Errorf("seed %d: %d events handled, %d committed", seed, len(handled), want)
	}
	if m := orderErr.Load(); m != nil {
		t.Errorf("seed %d: %s", seed, *m)
	}
	t.Logf("%d producers, %d hosts, %d events committed, sequencer killed %d times, staging rotated %d times in %d tries",
		producers, hosts, want, kills, rotations[0], rotations[1])
}

// produceSequenced runs tx: its events (1 to 8, hosts at random), through
// Go or SQL, then a commit or, one time in six, a rollback; one time in
// ten it holds the transaction open up to 50 ms before it ends.
func produceSequenced(ctx context.Context, pool *pgxpool.Pool, rng *rand.Rand, tx *seqTx, hosts int, clock *atomic.Int64) error {
	n := 1 + rng.IntN(8)
	for range n {
		tx.hosts = append(tx.hosts, fmt.Sprintf("h%d", rng.IntN(hosts)))
	}
	payload := func(i int) []byte { return []byte(fmt.Sprintf(`{"tx":%d,"i":%d}`, tx.id, i)) }
	how := rng.IntN(5)
	rollback := rng.IntN(6) == 0
	hold := rng.IntN(10) == 0
	ptx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = ptx.Rollback(ctx) }()
	tx.start = clock.Add(1)
	switch how {
	case 0: // Go, one call
		evs := make([]Event, n)
		for i, h := range tx.hosts {
			evs[i] = Event{HostID: h, EventType: "t", Payload: payload(i)}
		}
		res, err := AppendResults(ctx, ptx, evs...)
		if err != nil {
			return err
		}
		for i, r := range res {
			if !r.Sequenced || r.Partition != -1 || r.Duplicate || (i > 0 && r.Offset <= res[i-1].Offset) {
				return fmt.Errorf("append results %+v: want sequence numbers, ascending", res)
			}
		}
	case 4: // Go, one call, without results
		evs := make([]Event, n)
		for i, h := range tx.hosts {
			evs[i] = Event{HostID: h, EventType: "t", Payload: payload(i)}
		}
		seqs, err := Append(ctx, ptx, evs...)
		if err != nil {
			return err
		}
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				return fmt.Errorf("sequence numbers %v: want them ascending", seqs)
			}
		}
	case 3: // Go, one call per event, without results
		prev := int64(0)
		for i, h := range tx.hosts {
			seqs, err := Append(ctx, ptx, Event{HostID: h, EventType: "t", Payload: payload(i)})
			if err != nil {
				return err
			}
			if seqs[0] <= prev {
				return fmt.Errorf("sequence number %d after %d", seqs[0], prev)
			}
			prev = seqs[0]
		}
	case 1: // SQL, one event per call
		for i, h := range tx.hosts {
			if _, err := ptx.Exec(ctx, `SELECT append_event(1, $1, '', 't', $2::jsonb)`, h, string(payload(i))); err != nil {
				return err
			}
		}
	default: // SQL, one array
		type item struct {
			HostID    string          `json:"host_id"`
			EventType string          `json:"event_type"`
			Payload   json.RawMessage `json:"payload"`
		}
		items := make([]item, n)
		for i, h := range tx.hosts {
			items[i] = item{h, "t", payload(i)}
		}
		body, _ := json.Marshal(items)
		if _, err := ptx.Exec(ctx, `SELECT append_events(1, $1::jsonb)`, string(body)); err != nil {
			return err
		}
	}
	if hold {
		time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond) // a long transaction, not a synchronisation
	}
	if rollback {
		return ptx.Rollback(ctx)
	}
	if err := ptx.Commit(ctx); err != nil {
		return err
	}
	tx.committed = clock.Add(1)
	return nil
}

// checkSequencedLog checks the log against the model (see
// TestSequencedModel).
func checkSequencedLog(t *testing.T, seed uint64, pool *pgxpool.Pool, txs [][]*seqTx) {
	t.Helper()
	type row struct {
		part, tx, i int
		off, xid    int64
		host        string
	}
	rows, err := pool.Query(context.Background(), `SELECT partition_id, c_offset, transaction_id, host_id, (payload->>'tx')::int, (payload->>'i')::int
		FROM outbox_message_t WHERE topic_id = 1 ORDER BY partition_id, c_offset`)
	if err != nil {
		t.Fatal(err)
	}
	var log []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.part, &r.off, &r.xid, &r.host, &r.tx, &r.i); err != nil {
			t.Fatal(err)
		}
		log = append(log, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	byID := map[int]*seqTx{}
	for _, ts := range txs {
		for _, tx := range ts {
			byID[tx.id] = tx
		}
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d: "+format, append([]any{seed}, args...)...)
	}
	seen := map[[2]int]bool{}
	xidOf := map[int]int64{}
	txOfXid := map[int64]int{}
	last := map[int]row{}
	where := map[[2]int]row{}
	for _, r := range log {
		tx := byID[r.tx]
		if tx == nil || tx.committed == 0 {
			fail("event %d/%d in the log: its transaction rolled back", r.tx, r.i)
		}
		if tx.hosts[r.i] != r.host {
			fail("event %d/%d: host %s, appended for %s", r.tx, r.i, r.host, tx.hosts[r.i])
		}
		k := [2]int{r.tx, r.i}
		if seen[k] {
			fail("event %d/%d twice in the log", r.tx, r.i)
		}
		seen[k] = true
		where[k] = r
		if x, ok := xidOf[r.tx]; ok && x != r.xid {
			fail("transaction %d: events with transaction ids %d and %d", r.tx, x, r.xid)
		}
		if o, ok := txOfXid[r.xid]; ok && o != r.tx {
			fail("transaction id %d on transactions %d and %d", r.xid, o, r.tx)
		}
		xidOf[r.tx], txOfXid[r.xid] = r.xid, r.tx
		prev, ok := last[r.part]
		if want := prev.off + 1; r.off != want {
			fail("partition %d: offset %d after %d", r.part, r.off, prev.off)
		}
		if ok && prev.tx == r.tx && prev.i > r.i {
			fail("transaction %d: event %d after %d in partition %d", r.tx, r.i, prev.i, r.part)
		}
		last[r.part] = r
	}
	// Contiguity: a transaction's events of a partition take consecutive
	// offsets.
	span := map[[2]int][2]int64{} // (tx, partition) -> first, last offset
	count := map[[2]int]int64{}
	for _, r := range log {
		k := [2]int{r.tx, r.part}
		s, ok := span[k]
		if !ok {
			s = [2]int64{r.off, r.off}
		}
		s[1] = r.off
		span[k] = s
		count[k]++
	}
	for k, s := range span {
		if s[1]-s[0]+1 != count[k] {
			fail("transaction %d: its %d events of partition %d span offsets %d-%d", k[0], count[k], k[1], s[0], s[1])
		}
	}
	for _, tx := range byID {
		if tx.committed == 0 {
			continue
		}
		for i := range tx.hosts {
			if !seen[[2]int{tx.id, i}] {
				fail("event %d/%d committed, not in the log", tx.id, i)
			}
		}
	}
	// Causality, per partition: b's transaction began after a's committed.
	for ka, a := range where {
		ta := byID[ka[0]]
		for kb, b := range where {
			if a.part != b.part {
				continue
			}
			if tb := byID[kb[0]]; tb.start > ta.committed && b.off < a.off {
				fail("partition %d: event %d/%d (offset %d) inserted after %d/%d (offset %d) committed, and before it",
					a.part, kb[0], kb[1], b.off, ka[0], ka[1], a.off)
			}
		}
	}
}

// TestSequencedKeysAndRepartition, on a sequenced topic with no consumer
// (the ticks run here): an idempotency key staged twice, in one call,
// across calls and from concurrent sessions gives one event, and its
// duplicates return the first one's sequence number; events staged before
// and after a repartition land in their host's partition of the count at
// their tick, each partition's offsets gapless; staging rows of a
// rolled-back transaction are never sequenced.
func TestSequencedKeysAndRepartition(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 2, Scope: schema.ScopeSequenced})
	tick := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT sequence_tick(1)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ev := func(host, key string) Event {
		return Event{HostID: host, EventType: "t", Payload: []byte(`{}`), IdempotencyKey: key}
	}
	// Bad input from SQL: the error names what is missing, nothing is staged.
	for sql, want := range map[string]string{
		`SELECT append_events(1, '[{"host_id": "a", "event_type": "t"}, {"event_type": "t"}]')`: "event 2: host_id is required",
		`SELECT append_events(1, '{"host_id": "a"}')`:                                           "must be a JSON array",
		`SELECT append_event(1, 'a', '', '', '{}')`:                                             "event_type is required",
	} {
		if _, err := pool.Exec(ctx, sql); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: error %v, want one saying %q", sql, err, want)
		}
	}
	res, err := AppendResults(ctx, pool, ev("a", "k1"), ev("b", "k1"), ev("c", ""))
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Sequenced || res[0].Duplicate || !res[1].Duplicate || res[1].Offset != res[0].Offset || res[2].Duplicate {
		t.Fatalf("results %+v: want k1 staged once, its repeat a duplicate with its sequence number", res)
	}
	// Concurrent sessions, one key: one event.
	var wg sync.WaitGroup
	dups := make([]bool, 8)
	for i := range dups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := AppendResults(ctx, pool, ev(fmt.Sprintf("x%d", i), "k2"))
			if err != nil {
				t.Error(err)
				return
			}
			dups[i] = r[0].Duplicate
		}()
	}
	wg.Wait()
	fresh := 0
	for _, d := range dups {
		if !d {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("key k2 staged %d times from 8 sessions, want once", fresh)
	}
	// A rolled-back transaction's event.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Append(ctx, tx, ev("gone", "")); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if n := tick(); n != 3 {
		t.Fatalf("first tick sequenced %d events, want 3 (a, c and one of k2)", n)
	}
	var k1Part, k1Off int64
	if err := pool.QueryRow(ctx, `SELECT partition_id, c_offset FROM idempotency_keys WHERE topic_id = 1 AND key = 'k1'`).Scan(&k1Part, &k1Off); err != nil {
		t.Fatal(err)
	}
	var aPart, aOff int64
	if err := pool.QueryRow(ctx, `SELECT partition_id, c_offset FROM outbox_message_t WHERE topic_id = 1 AND host_id = 'a'`).Scan(&aPart, &aOff); err != nil {
		t.Fatal(err)
	}
	if k1Part != aPart || k1Off != aOff {
		t.Fatalf("key k1 records partition %d offset %d, its event is at %d/%d", k1Part, k1Off, aPart, aOff)
	}
	// Staged before the repartition, sequenced after it: the new count.
	hosts := make([]Event, 40)
	for i := range hosts {
		hosts[i] = ev(fmt.Sprintf("h%d", i), "")
	}
	if _, err := Append(ctx, pool, hosts[:20]...); err != nil {
		t.Fatal(err)
	}
	if _, err := schema.Repartition(ctx, pool, 1, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := Append(ctx, pool, hosts[20:]...); err != nil {
		t.Fatal(err)
	}
	if n := tick(); n != 40 {
		t.Fatalf("second tick sequenced %d events, want 40", n)
	}
	if n := tick(); n != 0 {
		t.Fatalf("a tick with nothing new sequenced %d events", n)
	}
	var wrong, gaps int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE host_id LIKE 'h%' AND partition_id <> event_partition(host_id, 5)),
		(SELECT count(*) FROM (SELECT c_offset - row_number() OVER (PARTITION BY partition_id ORDER BY c_offset) AS d
		   FROM outbox_message_t WHERE topic_id = 1) x WHERE d <> 0)
		FROM outbox_message_t WHERE topic_id = 1`).Scan(&wrong, &gaps); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 || gaps != 0 {
		t.Fatalf("%d events outside their host's partition of 5, %d offsets out of 1..n per partition", wrong, gaps)
	}
	var total int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1 AND host_id = 'gone'`).Scan(&total); err != nil || total != 0 {
		t.Fatalf("rolled-back event sequenced (%d, %v)", total, err)
	}
	// The event ids are the ones drawn at staging (a tick done again after
	// a crash keeps them).
	var other int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_message_t m WHERE m.topic_id = 1
		AND NOT EXISTS (SELECT 1 FROM staged_events s WHERE s.topic_id = 1 AND s.event_id = m.event_id)`).Scan(&other); err != nil || other != 0 {
		t.Fatalf("%d events of the log with an id not drawn at staging (%v)", other, err)
	}
}

// TestSequencedLongTransaction: a producer transaction staged an event and
// stays open; meanwhile other sessions append to every partition (its own
// included, and its own host), without waiting, and their events are
// handled while it is still open. Once it commits, its event is handled
// too, after every event of its partition that committed before it.
func TestSequencedLongTransaction(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 4, Scope: schema.ScopeSequenced})
	var handled atomic.Int64
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(context.Context, pgx.Tx, *Event) error { handled.Add(1); return nil }))
	startConsumer(t, pool, Config{TotalPartitions: 4, Handlers: hs})
	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(ctx) }()
	if _, err := Append(ctx, long, Event{HostID: "long", EventType: "t", Payload: []byte(`{"long":true}`)}); err != nil {
		t.Fatal(err)
	}
	// Others, from other sessions: each append returns without waiting
	// for the open transaction (a wait would hang the test).
	for i := range 50 {
		evs := []Event{{HostID: fmt.Sprintf("h%d", i%9), EventType: "t", Payload: []byte(`{}`)}, {HostID: "long", EventType: "t", Payload: []byte(`{}`)}}
		if _, err := Append(ctx, pool, evs...); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.WaitFor(t, 20*time.Second, "the other transactions' events handled while one is open", func() bool { return handled.Load() == 100 })
	if err := long.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the long transaction's event handled", func() bool { return handled.Load() == 101 })
	var last bool
	if err := pool.QueryRow(ctx, `SELECT payload ? 'long' FROM outbox_message_t WHERE topic_id = 1
		AND partition_id = event_partition('long', 4) ORDER BY c_offset DESC LIMIT 1`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if !last {
		t.Fatal("the long transaction's event is not the last of its partition, though it committed last")
	}
}

// TestSequencedTickReadsByIndex: a tick finds what it moves through the
// staging table's xid index, never by reading the table whole (0023):
// neither a tick that moves events, nor an empty one, nor one that moves
// the events of a transaction that was in progress at the previous tick
// (its id among that snapshot's in-progress ones), scans a staging table
// sequentially, with thousands of staged events already sequenced beside
// them. Each tick runs in a transaction of its own, whose scans
// pg_stat_xact_user_tables counts; the number of events it moved is
// checked too.
func TestSequencedTickReadsByIndex(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 4, Scope: schema.ScopeSequenced})
	stage := func(q schema.DB, n int) {
		t.Helper()
		evs := make([]Event, n)
		for i := range evs {
			evs[i] = Event{HostID: fmt.Sprintf("h%d", i%13), EventType: "t", Payload: []byte(`{}`)}
		}
		if _, err := Append(ctx, q, evs...); err != nil {
			t.Fatal(err)
		}
	}
	// tick runs one tick in a transaction and checks what it moved and
	// how it read the staging tables.
	tick := func(want int) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		// The session's counts not yet reported are counted in too: the
		// tick's are the difference.
		scans := func() (seq, idx int64) {
			t.Helper()
			if err := tx.QueryRow(ctx, `SELECT coalesce(sum(seq_scan), 0), coalesce(sum(idx_scan), 0)
				FROM pg_stat_xact_user_tables WHERE relname LIKE 'staged\_events\_1\_%'`).Scan(&seq, &idx); err != nil {
				t.Fatal(err)
			}
			return seq, idx
		}
		seq0, idx0 := scans()
		var n int
		if err := tx.QueryRow(ctx, `SELECT sequence_tick(1)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		seq1, idx1 := scans()
		seq, idx := seq1-seq0, idx1-idx0
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("the tick moved %d events, want %d", n, want)
		}
		if seq != 0 || idx == 0 {
			t.Fatalf("a tick that moved %d events scanned the staging tables %d times sequentially, %d times by index; want by index only", n, seq, idx)
		}
	}
	for range 40 {
		stage(pool, 100)
	}
	tick(4000)
	tick(0)
	open, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback(ctx) }()
	stage(open, 3) // in progress at the next tick
	stage(pool, 5)
	tick(5)
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tick(3)
	tick(0)
}

// wakeCounter is an Observer that counts the workers' wake-ups by source.
type wakeCounter struct {
	nopObserver
	mu sync.Mutex
	n  map[WakeSource]int
}

func (o *wakeCounter) Woken(_ int, s WakeSource) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[WakeSource]int{}
	}
	o.n[s]++
}

func (o *wakeCounter) count(s WakeSource) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[s]
}

// TestSequencedTicksWakeWorkers: the workers of a sequenced topic learn of
// its events from the tick that moved them (0023: a tick notifies every
// partition it moved, whatever the topic's wake-up mode), not from the
// watcher, which does not run for a sequenced topic, nor from the poll,
// which comes once a minute here. Two consumers of the group serve two
// partitions each (static mode); one of them runs the sequencer, and hears
// its ticks' announcements on the sequencer's own session (WakeTick), the
// other through its listener (WakeNotify). Producer transactions of one to
// four events over several hosts, with seeded gaps around the watcher's
// quiet threshold (a partition of a topic in mode 'waiting' would go to
// sleep between them), are all handled once and in order well before the
// poll. Without the sequencer's LISTEN on the topic's channel, no worker
// is woken by a tick.
func TestSequencedTicksWakeWorkers(t *testing.T) {
	t.Parallel()
	rng, _ := sequencedRand(t, 23)
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 4, Scope: schema.ScopeSequenced})
	mustExec(t, pool, handledTable)
	obs := []*wakeCounter{{}, {}}
	for i, parts := range [][]int{{0, 1}, {2, 3}} {
		startConsumer(t, pool, Config{TotalPartitions: 4, Partitions: parts, ReplicaID: fmt.Sprintf("r%d", i),
			WaitPeriod: time.Minute, Handlers: recordingHandlers(), Observer: obs[i]})
	}
	total := 0
	for i := range 40 {
		evs := make([]Event, 1+rng.IntN(4))
		for j := range evs {
			evs[j] = Event{HostID: fmt.Sprintf("h%d", rng.IntN(7)), EventType: "t", Payload: []byte(fmt.Sprintf(`{"tx":%d,"i":%d}`, i, j))}
		}
		appendTx(t, pool, evs...)
		total += len(evs)
		gap := time.Duration(rng.IntN(120)) * time.Millisecond
		time.Sleep(gap) // the producers' pace, not a synchronisation
	}
	waitHandled(t, pool, int64(total), 15*time.Second)
	checkHandled(t, pool)
	// The consumer whose sequencer ticked, and the other one.
	seq, other := obs[0], obs[1]
	if seq.count(WakeTick) == 0 {
		seq, other = other, seq
	}
	if n := seq.count(WakeTick); n == 0 {
		t.Fatalf("no worker was woken by its own sequencer's tick (notifications: %d and %d)", obs[0].count(WakeNotify), obs[1].count(WakeNotify))
	}
	if n := other.count(WakeTick); n > 0 {
		t.Fatalf("both consumers' workers were woken by their own sequencer's ticks (%d and %d): only one sequences", seq.count(WakeTick), n)
	}
	if n := other.count(WakeNotify); n == 0 {
		t.Fatal("the consumer that does not sequence was never woken by a notification")
	}
	for i, o := range obs {
		if tail, flight := o.count(WakeTail), o.count(WakeInFlight); tail+flight > 0 {
			t.Fatalf("the watcher woke workers of consumer %d of a sequenced topic (%d from tails, %d from appends in flight); want ticks and notifications only", i, tail, flight)
		}
	}
}

// TestSequencerFollowsChannelChange: when the topic's channel changes
// (schema.SetChannel) under a running consumer of a sequenced topic, its
// sequencer's session listens on the new channel as its listener does, so
// the ticks still wake its workers at their commit (WakeTick), not only
// through the listener's copy. Every event, before and after the change,
// is handled once and in order. Without the sequencer following the
// channel, no worker is woken by a tick after the change.
func TestSequencerFollowsChannelChange(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	rng, _ := sequencedRand(t, 29)
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 4, Scope: schema.ScopeSequenced})
	mustExec(t, pool, handledTable)
	obs := &wakeCounter{}
	c := startConsumer(t, pool, Config{TotalPartitions: 4, WaitPeriod: time.Minute, Handlers: recordingHandlers(), Observer: obs})
	total := 0
	produce := func(n int) {
		for i := range n {
			evs := make([]Event, 1+rng.IntN(3))
			for j := range evs {
				evs[j] = Event{HostID: fmt.Sprintf("h%d", rng.IntN(7)), EventType: "t", Payload: []byte(fmt.Sprintf(`{"tx":%d,"i":%d}`, i, j))}
			}
			appendTx(t, pool, evs...)
			total += len(evs)
			waitHandled(t, pool, int64(total), 10*time.Second)
		}
	}
	produce(10)
	if obs.count(WakeTick) == 0 {
		t.Fatal("no worker was woken by its own sequencer's tick before the channel changed")
	}
	if err := schema.SetChannel(ctx, pool, 1, "moved_here"); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 10*time.Second, "the consumer listens on the new channel", func() bool {
		ln := c.ln.Load()
		return ln.Channel() == "moved_here" && ln.Ready()
	})
	before := obs.count(WakeTick)
	produce(20)
	if obs.count(WakeTick) == before {
		t.Fatalf("no worker was woken by its own sequencer's tick after the channel changed (%d notifications)", obs.count(WakeNotify))
	}
	checkHandled(t, pool)
}
