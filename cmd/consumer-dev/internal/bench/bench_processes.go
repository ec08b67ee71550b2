package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

// benchProcessesShape is a deployment of the processes case: how many
// `consumer run` processes serve a topic of how many partitions.
type benchProcessesShape struct {
	name       string
	partitions int
	// perPartition: one process per partition (partitionId: k); otherwise
	// one process serves every partition.
	perPartition bool
	// mode is the topic's mode: a new topic's default, or sequenced (whose
	// sequencer one of the processes runs, elected among them).
	mode benchProducerMode
}

// benchProcessesShapes are the processes case's deployments: one process
// for 8 partitions, one process per partition of 8 (the
// deployment docs/deploying.md describes), the same for a sequenced topic,
// and one per partition of 16.
var benchProcessesShapes = []benchProcessesShape{
	{"1 process, 8 partitions", 8, false, benchDefaultMode},
	{"8 processes, one per partition", 8, true, benchDefaultMode},
	{"8 processes, one per partition, sequenced", 8, true, benchProducerMode{name: "sequenced", scope: schema.ScopeSequenced}},
	{"16 processes, one per partition", 16, true, benchDefaultMode},
}

// processes returns how many processes the shape runs.
func (s benchProcessesShape) processes() int {
	if s.perPartition {
		return s.partitions
	}
	return 1
}

const (
	// benchProcessesGroup is the consumer group of every process.
	benchProcessesGroup = "processes"
	// benchProcessesRate is the offered load: single-event transactions
	// per second.
	benchProcessesRate = 1000
	// benchProcessesProducers is how many paced producers offer it.
	benchProcessesProducers = 4
	// benchProcessesLate is how long after its scheduled time a producer
	// transaction may commit and still count as on schedule.
	benchProcessesLate = 100 * time.Millisecond
	// benchProcessesSample is how often the server sessions of the
	// consumers are listed, and their CPU read.
	benchProcessesSample = 200 * time.Millisecond
	// benchProcessesIdle is how long the idle check counts transactions.
	benchProcessesIdle = 5 * time.Second
	// benchProcessesSessionsBy is how long after the consumers caught up
	// the idle sessions are counted at the latest.
	benchProcessesSessionsBy = 40 * time.Second
	// benchProcessesIdleSettle is how long the idle check waits, after the
	// load, before it counts.
	benchProcessesIdleSettle = 11 * time.Second
)

// benchSeenDDL creates the table the consumers' sql handler writes: per
// event handled, its offset, partition and append time, and the time from
// its append statement (created_at is clock_timestamp() at append_event)
// to the handler's statement, in microseconds, on the database's clock.
const benchSeenDDL = `CREATE TABLE bench_seen (
    c_offset     bigint      NOT NULL,
    partition_id integer     NOT NULL,
    created_at   timestamptz NOT NULL,
    lat_us       bigint      NOT NULL
)`

// benchSeenStatement is the consumers' sql handler: one INSERT into
// bench_seen per event, with the parameters pgevents.SQLHandler binds.
const benchSeenStatement = `INSERT INTO bench_seen (c_offset, partition_id, created_at, lat_us) VALUES (@c_offset, @partition_id, @created_at::timestamptz, round(extract(epoch FROM clock_timestamp() - @created_at::timestamptz) * 1000000)::bigint)`

// benchSeenLatencySQL returns the count and the 50th and 99th percentiles,
// in microseconds, of the latencies of the events appended between $1 and
// $2.
const benchSeenLatencySQL = `SELECT count(*), coalesce(percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY lat_us), ARRAY[0, 0]::float8[])
FROM bench_seen WHERE created_at >= $1 AND created_at < $2`

// benchCaughtUpSQL is true when every partition ($2 of them) of topic $3
// has an offsets row of group $1 and no event at or beyond it, and, for a
// sequenced topic, no committed staged event the sequencer's last tick did
// not see (its snapshot): one still waiting for an offset.
const benchCaughtUpSQL = `SELECT count(*) = $2 AND coalesce(bool_and(NOT EXISTS (
    SELECT 1 FROM outbox_message_t m
    WHERE m.topic_id = o.topic_id AND m.partition_id = o.partition_id AND m.c_offset >= o.next_offset)), false)
  AND NOT EXISTS (SELECT 1 FROM staged_events e JOIN sequencer_ticks s ON s.topic_id = e.topic_id
                  WHERE e.topic_id = $3 AND NOT pg_visible_in_snapshot(e.xid, s.snapshot)
                    AND pg_xact_status(e.xid) = 'committed')
FROM consumer_offsets o WHERE o.group_id = $1 AND o.topic_id = $3`

// benchConsumerSessionsSQL lists the server sessions of the consumer
// processes: the client backends of the database but the bench's own
// (its monitoring pool, pgevents-bench, and its producers, bench-*).
// Sessions are told by what they are not: the consumer processes' pools
// name theirs pgevents-consumer, but their listeners and watchers name
// theirs otherwise.
const benchConsumerSessionsSQL = `SELECT pid, application_name FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
  AND application_name <> 'pgevents-bench' AND application_name NOT LIKE 'bench-%'`

// benchProcesses measures the deployments users run: this very binary as
// `consumer run --config yml` processes (one for every partition, one per
// partition of 8, the same for a sequenced topic, one per partition of
// 16), one consumer group with a sql handler that records each event's
// latency in the database, under
// single-event transactions offered at 1,000/s by paced producers. Per
// deployment: the share of offered transactions committed on schedule,
// the append statement → handler latency, the CPU per event of the
// processes and of their server sessions, the machine's busy share, and
// the transactions the idle deployment runs.
func benchProcesses(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var out []benchResult
	for _, s := range benchProcessesShapes {
		rs, err := benchProcessesRun(ctx, e, exe, s)
		out = append(out, rs...)
		if err != nil {
			return out, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return out, nil
}

// benchProcessesWindow is what one window of the processes case measured.
type benchProcessesWindow struct {
	onSchedule float64 // share of the offered transactions
	p50, p99   float64 // ms
	procUS     float64 // consumer processes' CPU per event
	serverUS   float64 // their server sessions' CPU per event
	busy       float64 // share of the machine's cores
	committed  int64   // transactions committed in the window
	late       int64   // of which more than benchProcessesLate after their time
	// consumers and producers are what each side ran per event, from
	// pg_stat_statements (zero without it).
	consumers, producers benchStatements
	// waits are the wait events of each side's active sessions, sampled
	// every benchProcessesWaitEvery through the window.
	waits struct{ consumers, producers string }
}

// benchProcessesWaitEvery is how often a window samples the wait events of
// the active sessions.
const benchProcessesWaitEvery = 20 * time.Millisecond

// benchProcessesRun measures one deployment on a database of its own.
func benchProcessesRun(ctx context.Context, e *benchEnv, exe string, s benchProcessesShape) ([]benchResult, error) {
	db, err := e.newModeDB(ctx, s.partitions, s.mode)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := db.countStatements(ctx); err != nil {
		return nil, err
	}
	if err := db.exec(ctx, benchSeenDDL); err != nil {
		return nil, err
	}
	ppool, err := db.openPoolAs(ctx, db.roleURL(benchProducerRole), "bench-producer", benchProcessesProducers+2, nil)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgevents-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	procs := make([]*benchProc, 0, s.processes())
	defer func() {
		for _, p := range procs {
			p.kill()
		}
	}()
	for k := range s.processes() {
		partition := -1
		if s.perPartition {
			partition = k
		}
		yml := fmt.Sprintf("groupId: %s\ntotalPartitions: %d\npartitionId: %d\nbatchSize: 100\nwaitPeriodMs: 10000\nlogLevel: warn\nlogFormat: json\nhandlers:\n  - eventType: \"*\"\n    type: sql\n    statement: %q\n",
			benchProcessesGroup, s.partitions, partition, benchSeenStatement)
		p, err := startBenchProc(exe, filepath.Join(dir, fmt.Sprintf("consumer-%d.yml", k)), yml, db.consumerURL())
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	fail := func(err error) ([]benchResult, error) {
		var logs []string
		for i, p := range procs {
			if l := strings.TrimSpace(p.logs.String()); l != "" {
				logs = append(logs, fmt.Sprintf("process %d: %s", i, l))
			}
		}
		if len(logs) > 0 {
			return nil, fmt.Errorf("%w; consumer output: %s", err, strings.Join(logs, "; "))
		}
		return nil, err
	}
	caughtUp := func() (bool, error) {
		for i, p := range procs {
			if err := p.exitErr(); err != nil {
				return false, fmt.Errorf("consumer process %d exited: %w", i, err)
			}
		}
		var ok bool
		err := db.pool.QueryRow(ctx, benchCaughtUpSQL, benchProcessesGroup, s.partitions, benchTopic).Scan(&ok)
		return ok, err
	}
	if err := benchWait(ctx, 60*time.Second, "consumer processes started", caughtUp); err != nil {
		return fail(err)
	}
	var onSchedule atomic.Int64
	load := benchLoad{producers: benchProcessesProducers, txSize: 1, rate: newBenchRate(benchProcessesRate),
		txFn: benchAppendCommitTx(benchTopic),
		onCommit: func(_ []pgevents.Event, t benchTxTimes) {
			if !t.due.IsZero() && t.done.Sub(t.due) <= benchProcessesLate {
				onSchedule.Add(1)
			}
		}}
	// Warm up: connections, prepared statements, caches, every partition
	// awake once.
	if _, err := load.run(ctx, ppool, 2*time.Second, nil); err != nil {
		return fail(err)
	}
	if err := benchWait(ctx, 60*time.Second, "consumers caught up", caughtUp); err != nil {
		return fail(err)
	}
	window := benchPick(e, 10*time.Second, 5*time.Second)
	var ws []benchProcessesWindow
	for rep := range e.reps {
		if err := db.ensureSegments(ctx); err != nil {
			return fail(err)
		}
		w, err := benchProcessesMeasure(ctx, e, db, ppool, procs, load, &onSchedule, window, caughtUp)
		if err != nil {
			return fail(err)
		}
		ws = append(ws, w)
		e.logf("processes: %s, window %d: %d transactions committed (%d late), %.1f%% on schedule, latency p50 %.2f ms p99 %.2f ms, CPU/event %.1f µs processes + %.1f µs server sessions, machine %.0f%% busy",
			s.name, rep+1, w.committed, w.late, 100*w.onSchedule, w.p50, w.p99, w.procUS, w.serverUS, 100*w.busy)
		e.logf("processes: %s, window %d, wait events of the active sessions (every %s): %s; %s", s.name, rep+1, benchProcessesWaitEvery, w.waits.producers, w.waits.consumers)
		w.consumers.log(e, fmt.Sprintf("processes: %s, window %d, consumers", s.name, rep+1))
		w.producers.log(e, fmt.Sprintf("processes: %s, window %d, producers", s.name, rep+1))
	}
	idle, idleNote, sessions, err := benchProcessesIdleRate(ctx, e, db, s.processes(), caughtUp)
	if err != nil {
		return fail(err)
	}
	e.logf("processes: %s, idle: %.2f transactions/s, %d server sessions", s.name, idle, sessions)
	for i, p := range procs {
		if err := p.stop(); err != nil {
			return fail(fmt.Errorf("consumer process %d: %w", i, err))
		}
	}

	col := func(f func(benchProcessesWindow) float64) []float64 {
		xs := make([]float64, len(ws))
		for i, w := range ws {
			xs[i] = f(w)
		}
		return xs
	}
	shape := fmt.Sprintf("%d `consumer run` process(es) of this binary, one group, %d partitions, batchSize 100, sql handler (one INSERT into bench_seen per event)", s.processes(), s.partitions)
	if s.perPartition {
		shape += ", partitionId k in process k"
	}
	if s.mode.scope == schema.ScopeSequenced {
		shape += ", a sequenced topic (its sequencer in the process elected among them)"
	}
	load1 := fmt.Sprintf("%d single-event transactions/s offered by %d paced producers (pgevents.AppendCommit) for %s per window, after a 2 s warm-up and with the consumers caught up at its start", benchProcessesRate, benchProcessesProducers, window)
	cpuHow := "from the window's start until the consumers caught up after it, divided by the events appended in the window"
	name := func(m string) string { return s.name + ": " + m }
	return []benchResult{
		newBenchResult("processes", name("committed on schedule"), "%", col(func(w benchProcessesWindow) float64 { return 100 * w.onSchedule })).
			noted("%s; %s; the producer transactions that committed within %s of their scheduled time, as a share of rate × window; wait events of the active sessions in the last window (pg_stat_activity every %s, by role): %s; %s",
				shape, load1, benchProcessesLate, benchProcessesWaitEvery, ws[len(ws)-1].waits.producers, ws[len(ws)-1].waits.consumers),
		newBenchResult("processes", name("producers' committed rate"), "tx/s", col(func(w benchProcessesWindow) float64 { return float64(w.committed) / window.Seconds() })).
			noted("the transactions the producers committed in the window, on schedule or late, per second of the window (%d offered)", benchProcessesRate),
		newBenchResult("processes", name("append statement → handler latency p50"), "ms", col(func(w benchProcessesWindow) float64 { return w.p50 })).
			noted("clock_timestamp() at the handler's INSERT minus created_at (clock_timestamp() at the append statement), on the database clock, for the events appended in the window"),
		newBenchResult("processes", name("append statement → handler latency p99"), "ms", col(func(w benchProcessesWindow) float64 { return w.p99 })).
			noted("as p50"),
		newBenchResult("processes", name("CPU per event, consumer processes"), "µs", col(func(w benchProcessesWindow) float64 { return w.procUS })).
			noted("utime+stime of every consumer process from /proc/<pid>/stat, %s", cpuHow),
		newBenchResult("processes", name("CPU per event, their server sessions"), "µs", col(func(w benchProcessesWindow) float64 { return w.serverUS })).
			noted("utime+stime from /proc/<pid>/stat of the client backends of the database but the bench's own (pg_stat_activity, listed every %s: a session that appears counts from 0, one that exits up to its last reading), %s", benchProcessesSample, cpuHow),
		newBenchResult("processes", name("CPU per event, processes + sessions"), "µs", col(func(w benchProcessesWindow) float64 { return w.procUS + w.serverUS })).
			noted("the sum of the two rows above"),
		newBenchResult("processes", name("machine CPU busy"), "%", col(func(w benchProcessesWindow) float64 { return 100 * w.busy })).
			noted("the share of all cores busy (/proc/stat) over the same span, whoever used them: producers, bench and other work on the machine included"),
		newBenchResult("processes", name("consumer statements per event, client"), "1", col(func(w benchProcessesWindow) float64 { return w.consumers.top })).
			noted("pg_stat_statements (track = all for this case's database) of the consumers' role over the window and the catch-up after it, per event appended in the window: the statements the consumer processes sent (BEGIN and COMMIT included); 0 without pg_stat_statements"),
		newBenchResult("processes", name("consumer statements per event, with nested"), "1", col(func(w benchProcessesWindow) float64 { return w.consumers.all })).
			noted("the same, with the statements run inside functions"),
		newBenchResult("processes", name("producer statements per event, with nested"), "1", col(func(w benchProcessesWindow) float64 { return w.producers.all })).
			noted("the producers' role, the same way (%.2f sent by the clients)", col(func(w benchProcessesWindow) float64 { return w.producers.top })[0]),
		newBenchResult("processes", name("idle transactions/s"), "1/s", []float64{idle}).
			noted("%s", idleNote),
		newBenchResult("processes", name("idle server sessions per process"), "1", []float64{float64(sessions) / float64(s.processes())}).
			noted("the consumer processes' client backends (pg_stat_activity) after the idle window above, divided by the processes (%d): read every second until there are two per process, or %s after the consumers caught up", s.processes(), benchProcessesSessionsBy),
	}, nil
}

// benchProcessesMeasure runs one window of load and measures it.
func benchProcessesMeasure(ctx context.Context, e *benchEnv, db *benchDB, ppool *pgxpool.Pool, procs []*benchProc, load benchLoad,
	onSchedule *atomic.Int64, window time.Duration, caughtUp func() (bool, error)) (benchProcessesWindow, error) {
	var w benchProcessesWindow
	sessions, err := startBenchSessionCPU(ctx, db.pool, benchConsumerSessionsSQL, benchProcessesSample)
	if err != nil {
		return w, err
	}
	defer sessions.stop()
	proc0 := make([]time.Duration, len(procs))
	for i, p := range procs {
		if proc0[i], err = benchProcCPU(p.pid()); err != nil {
			return w, err
		}
	}
	var t0, t1 time.Time
	if err := db.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t0); err != nil {
		return w, err
	}
	counted := db.resetStatements(ctx)
	cpu0 := readBenchCPU(0)
	onSchedule.Store(0)
	waits := &benchWaits{byRole: true}
	wctx, stopWaits := context.WithCancel(ctx)
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		waits.run(wctx, db.pool, benchProcessesWaitEvery)
	}()
	lr, err := load.run(ctx, ppool, window, nil)
	stopWaits()
	<-waited
	if err != nil {
		return w, err
	}
	w.waits.consumers, w.waits.producers = waits.summary(benchConsumerRole), waits.summary(benchProducerRole)
	if err := db.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t1); err != nil {
		return w, err
	}
	if err := benchWait(ctx, 60*time.Second, "consumers caught up", caughtUp); err != nil {
		return w, err
	}
	var procCPU time.Duration
	for i, p := range procs {
		c, err := benchProcCPU(p.pid())
		if err != nil {
			return w, err
		}
		procCPU += c - proc0[i]
	}
	serverCPU := sessions.stop()
	w.busy = readBenchCPU(0).since(cpu0).busy
	if lr.events == 0 {
		return w, errors.New("no event appended in the window")
	}
	if counted {
		if w.consumers, err = db.statements(ctx, benchConsumerRole, lr.events); err != nil {
			return w, err
		}
		if w.producers, err = db.statements(ctx, benchProducerRole, lr.events); err != nil {
			return w, err
		}
	}
	w.onSchedule = float64(onSchedule.Load()) / (benchProcessesRate * window.Seconds())
	w.committed, w.late = lr.events, lr.events-onSchedule.Load()
	w.procUS = float64(procCPU.Microseconds()) / float64(lr.events)
	w.serverUS = float64(serverCPU.Microseconds()) / float64(lr.events)
	var n int64
	var ps []float64
	if err := db.pool.QueryRow(ctx, benchSeenLatencySQL, t0, t1).Scan(&n, &ps); err != nil {
		return w, err
	}
	if n < lr.events {
		return w, fmt.Errorf("%d events appended in the window, %d recorded by the handler", lr.events, n)
	}
	w.p50, w.p99 = ps[0]/1000, ps[1]/1000
	return w, nil
}

// benchProcessesIdleRate waits until the consumers have caught up and the
// database has been vacuumed and analysed, then counts the transactions of
// the database over benchProcessesIdle, with nothing appended and the
// bench's own sessions on it silent; and, at the end of that window, how
// many server sessions the consumer processes hold.
func benchProcessesIdleRate(ctx context.Context, e *benchEnv, db *benchDB, procs int, caughtUp func() (bool, error)) (float64, string, int, error) {
	if err := benchWait(ctx, 60*time.Second, "consumers caught up", caughtUp); err != nil {
		return 0, "", 0, err
	}
	idleFrom := time.Now()
	if err := db.exec(ctx, `VACUUM (ANALYZE)`); err != nil {
		return 0, "", 0, err
	}
	// A backend reports its transaction counts at most every second, and
	// one that went idle with counts unreported reports them up to
	// PostgreSQL's idle interval (10 s) later: the load's counts arrived
	// in the idle window when it began 1.5 s after the load.
	select {
	case <-ctx.Done():
		return 0, "", 0, ctx.Err()
	case <-time.After(benchProcessesIdleSettle):
	}
	x0, _, err := benchDBXacts(ctx, e, db.name)
	if err != nil {
		return 0, "", 0, err
	}
	began := time.Now()
	select {
	case <-ctx.Done():
		return 0, "", 0, ctx.Err()
	case <-time.After(benchProcessesIdle):
	}
	x1, _, err := benchDBXacts(ctx, e, db.name)
	if err != nil {
		return 0, "", 0, err
	}
	took := time.Since(began)
	// The sessions: polled until they are down to two per process, or
	// benchProcessesSessionsBy after the consumers caught up (a worker
	// closes its session after 20 s without a batch).
	var sessions int
	for {
		if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM (`+benchConsumerSessionsSQL+`) s`).Scan(&sessions); err != nil {
			return 0, "", 0, err
		}
		if sessions <= 2*procs || time.Since(idleFrom) >= benchProcessesSessionsBy {
			break
		}
		select {
		case <-ctx.Done():
			return 0, "", 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	e.logf("processes: %d server sessions %s after the consumers caught up", sessions, time.Since(idleFrom).Round(time.Second))
	return float64(x1-x0) / took.Seconds(),
		fmt.Sprintf("from 11 s after the load, all caught up and the database vacuumed and analysed: xact_commit + xact_rollback of the database in pg_stat_database over %s (read from another database; the bench runs nothing on the database meanwhile; autovacuum's transactions would count too; a backend reports its counts up to a second late)",
			took.Round(time.Millisecond)), sessions, nil
}

// benchSessionCPU follows the CPU time of server sessions over a window:
// it lists them (sql: their pid and application_name) every every, and
// reads their /proc/<pid>/stat, a session present at the start counting
// from its reading then, one that appears later from 0, one that exits up
// to its last reading. Each session's part is named from its
// application_name (benchSessionPart).
type benchSessionCPU struct {
	pool   *pgxpool.Pool
	sql    string
	mu     sync.Mutex
	base   map[int]time.Duration
	last   map[int]time.Duration
	part   map[int]string
	err    error
	cancel context.CancelFunc
	done   chan struct{}
	total  time.Duration
	parts  map[string]time.Duration
	once   sync.Once
}

// startBenchSessionCPU takes the first reading of the sessions sql lists
// on pool and starts sampling them every every.
func startBenchSessionCPU(ctx context.Context, pool *pgxpool.Pool, sql string, every time.Duration) (*benchSessionCPU, error) {
	s := &benchSessionCPU{pool: pool, sql: sql, base: map[int]time.Duration{}, last: map[int]time.Duration{}, part: map[int]string{},
		done: make(chan struct{})}
	if err := s.sample(ctx, true); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
			if err := s.sample(sctx, false); err != nil && sctx.Err() == nil {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
			}
		}
	}()
	return s, nil
}

// sample lists the sessions and reads their CPU; first marks the reading
// at the window's start.
func (s *benchSessionCPU) sample(ctx context.Context, first bool) error {
	rows, err := s.pool.Query(ctx, s.sql)
	if err != nil {
		return err
	}
	type session struct {
		pid  int32
		name string
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (session, error) {
		var x session
		return x, r.Scan(&x.pid, &x.name)
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range list {
		pid := int(x.pid)
		c, err := benchProcCPU(pid)
		if err != nil {
			continue // exited since listed
		}
		if _, seen := s.base[pid]; !seen {
			if first {
				s.base[pid] = c
			} else {
				s.base[pid] = 0
			}
		}
		s.last[pid] = c
		s.part[pid] = benchSessionPart(x.name)
	}
	return nil
}

// stop takes a last reading, stops sampling and returns the CPU time of
// the sessions over the window (0 when their /proc cannot be read: the
// server on another machine); byPart splits it.
func (s *benchSessionCPU) stop() time.Duration {
	s.once.Do(func() {
		s.cancel()
		<-s.done
		_ = s.sample(context.Background(), false)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.parts = map[string]time.Duration{}
		for pid, c := range s.last {
			s.total += c - s.base[pid]
			s.parts[s.part[pid]] += c - s.base[pid]
		}
	})
	return s.total
}

// byPart returns, after stop, the sessions' CPU time by part, and the
// error of a sampling that failed (nil when all succeeded).
func (s *benchSessionCPU) byPart() (map[string]time.Duration, error) {
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.parts, s.err
}

// benchProc is a `consumer run` process of this binary.
type benchProc struct {
	cmd    *exec.Cmd
	logs   *benchTail
	exited chan error // receives Wait's result once; re-sent by readers
}

// startBenchProc writes yml to path and starts exe run --config path with
// DATABASE_URL set to url.
func startBenchProc(exe, path, yml, url string) (*benchProc, error) {
	if err := os.WriteFile(path, []byte(yml), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "run", "--config", path)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	p := &benchProc{cmd: cmd, logs: &benchTail{}, exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.exited <- cmd.Wait() }()
	return p, nil
}

// pid returns the process id.
func (p *benchProc) pid() int { return p.cmd.Process.Pid }

// exitErr returns a non-nil error when the process has exited.
func (p *benchProc) exitErr() error {
	select {
	case err := <-p.exited:
		p.exited <- err
		if err == nil {
			return errors.New("exit status 0")
		}
		return err
	default:
		return nil
	}
}

// stop sends SIGTERM and waits, at most 20 s, for a clean exit.
func (p *benchProc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.exited <- err
		if err != nil {
			return fmt.Errorf("exit after SIGTERM: %w", err)
		}
		return nil
	case <-time.After(20 * time.Second):
		return errors.New("did not exit within 20 s of SIGTERM")
	}
}

// kill kills the process unless it has exited, and waits for it.
func (p *benchProc) kill() {
	select {
	case err := <-p.exited:
		p.exited <- err
	default:
		_ = p.cmd.Process.Kill()
		p.exited <- <-p.exited
	}
}
