package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/cmd/consumer-dev/internal/latency"
	"github.com/pgevents/pgevents/schema"
)

// The peers case puts pgevents beside a job queue, River, and a queue of
// PgQ, each doing the same work on the same server in the same run:
// single-event producer transactions, each handled once by a consumer in
// the producers' process.
const (
	// benchPeersGroup is the pgevents consumer group of the case.
	benchPeersGroup = "peers"
	// benchPeersPartitions is the partition count of pgevents' topics.
	benchPeersPartitions = 8
	// benchPeersWarmup is how long the producers run before each paced
	// window, at its rate; the window starts once their events are
	// handled.
	benchPeersWarmup = time.Second
	// benchPeersScheduleWindow is how long the 3,000 tx/s window lasts.
	benchPeersScheduleWindow = 10 * time.Second
)

// benchPeersLoopPgq is PgQ's loop in the peers case, as low-latency as
// River's settings: a consumer that ticks the queue itself whenever it
// finds no batch (ticker_max_lag 1 ms: a tick as soon as an event waits
// and a millisecond has passed since the last), and looks again after a
// millisecond when neither a batch nor a tick came.
var benchPeersLoopPgq = benchPgqLoop{maxLag: time.Millisecond, idle: time.Millisecond}

// benchPeersMode is one measurement of the peers case.
type benchPeersMode int

const (
	// benchPeersLatency: 1,000 single-event transactions/s offered by 4
	// paced producers; latency, producer transactions, CPU per event.
	benchPeersLatency benchPeersMode = iota
	// benchPeersSchedule: 3,000/s offered by 16 producers for 10 s; how
	// many committed, and on schedule.
	benchPeersSchedule
	// benchPeersDrain: a preloaded backlog burned down.
	benchPeersDrain
)

// benchPeersModes are the modes in the order each repetition runs them.
var benchPeersModes = []benchPeersMode{benchPeersLatency, benchPeersSchedule, benchPeersDrain}

// String names the mode as the River program's -mode does.
func (m benchPeersMode) String() string {
	return [...]string{"latency", "schedule", "drain"}[m]
}

// benchPeersLoad returns the rate, producers and window of a paced mode.
func (e *benchEnv) peersLoad(m benchPeersMode) (rate float64, producers int, window time.Duration) {
	if m == benchPeersSchedule {
		return 3000, 16, benchPeersScheduleWindow
	}
	return 1000, 4, benchPick(e, 10*time.Second, 5*time.Second)
}

// peersBacklog returns the size of the drain's backlog.
func (e *benchEnv) peersBacklog() int64 { return benchPick(e, int64(100_000), int64(30_000)) }

// benchPeersWindow is what one run of one system in one mode measured.
type benchPeersWindow struct {
	events  int64   // events handled in the window
	seconds float64 // the window, from the first reading to the last
	// latency mode, in ms: COMMIT returned → handler start, the
	// producer's call → handler start, the producer's BEGIN → COMMIT
	// returned; p50 and p99.
	commit, call, tx [2]float64
	// latency mode: CPU µs per event handled, of the machine (every
	// process) and of the processes the bench knows (itself, the River
	// program, the server); the machine's busy share and the part of it
	// neither used.
	machineUS, ownUS, busy, foreign float64
	// latency mode: CPU µs per event handled by part: the sessions of the
	// system's database by application_name (benchSessionPart), the bench
	// process (producers, and the in-process consumers), the River program.
	parts map[string]float64
	// paced modes: transactions offered, committed, and committed within
	// one producer interval of their scheduled time.
	offered, committed, onTime int64
	drainRate                  float64 // drain mode: events/s
}

// benchPeersReading is a reading of CPU times around a window: the
// machine's, the bench's and the server's (benchCPU), and the River
// program's.
type benchPeersReading struct {
	cpu   benchCPU
	child time.Duration
}

// benchPeersSessionsSQL lists the sessions of the database, but the
// reader's own, with their application_name.
const benchPeersSessionsSQL = `SELECT pid, application_name FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`

// benchPeersSample is how often the sessions of a window are read while
// it lasts: a session that ends before the window's end (the River
// program closes its pools as soon as it has printed its end mark) is
// counted up to its last reading.
const benchPeersSample = 200 * time.Millisecond

// peersStart reads the CPU times at a window's start and starts following
// the sessions of db, the system's database (nil when they cannot be
// listed: the split by part is then left out); child is the River
// program's pid, 0 for none.
func (e *benchEnv) peersStart(ctx context.Context, db *pgxpool.Pool, child int) (benchPeersReading, *benchSessionCPU) {
	ss, err := startBenchSessionCPU(ctx, db, benchPeersSessionsSQL, benchPeersSample)
	if err != nil {
		e.logf("peers: the sessions' CPU not read: %v", err)
	}
	return e.peersReading(child), ss
}

// peersEnd reads the CPU times at a window's end, and returns the
// sessions' CPU time over the window by part (nil without ss).
func (e *benchEnv) peersEnd(ss *benchSessionCPU, child int) (benchPeersReading, map[string]time.Duration) {
	r := e.peersReading(child)
	if ss == nil {
		return r, nil
	}
	parts, err := ss.byPart()
	if err != nil {
		// The split is a note: the window's figures stand without it.
		e.logf("peers: the sessions' CPU not read: %v", err)
	}
	return r, parts
}

// peersReading reads the CPU times of the machine, the bench, the server
// and the River program (child; 0 for none).
func (e *benchEnv) peersReading(child int) benchPeersReading {
	r := benchPeersReading{cpu: e.cpu()}
	if child > 0 {
		r.child, _ = benchProcCPU(child)
	}
	return r
}

// benchSessionPart names the part of a system a session of application_name
// name belongs to.
func benchSessionPart(name string) string {
	for _, role := range []string{"watcher", "listener", "sequencer"} {
		if strings.HasPrefix(name, "pgevents "+role) {
			return role + "'s session"
		}
	}
	switch name {
	case "pgevents-listener":
		return "listener's session"
	case "bench-producer":
		return "producers' sessions"
	case "pgevents-consumer":
		return "consumer pool's sessions"
	case "river":
		return "River client's sessions"
	case "":
		return "unnamed sessions"
	}
	return name + " sessions"
}

// setCPU fills in the window's span and CPU per event from the readings
// around it, over events handled, and its split by part from the
// sessions' CPU time (sessions, by part; nil: no split).
func (w *benchPeersWindow) setCPU(r0, r1 benchPeersReading, sessions map[string]time.Duration, events int64) {
	w.events = events
	w.seconds = r1.cpu.at.Sub(r0.cpu.at).Seconds()
	busy, all := r1.cpu.machine(r0.cpu)
	own := r1.cpu.self - r0.cpu.self + r1.cpu.server - r0.cpu.server + r1.child - r0.child
	if all > 0 {
		w.busy = float64(busy) / float64(all)
		w.foreign = max(0, float64(busy-own)/float64(all))
	}
	if events > 0 {
		w.machineUS = float64(busy.Microseconds()) / float64(events)
		w.ownUS = float64(own.Microseconds()) / float64(events)
		w.parts = map[string]float64{}
		for part, c := range sessions {
			w.parts[part] += float64(c.Microseconds()) / float64(events)
		}
		w.parts["bench process"] = float64((r1.cpu.self - r0.cpu.self).Microseconds()) / float64(events)
		if r1.child > 0 {
			w.parts["River program"] = float64((r1.child - r0.child).Microseconds()) / float64(events)
		}
	}
}

// partsText lists the window's CPU per event by part, the largest first.
func (w benchPeersWindow) partsText() string {
	return benchPartsText(w.parts)
}

// benchPartsText lists CPU per event by part, the largest first.
func benchPartsText(parts map[string]float64) string {
	names := make([]string, 0, len(parts))
	for n := range parts {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if parts[a] != parts[b] {
			if parts[a] > parts[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var out []string
	for _, n := range names {
		if parts[n] >= 0.5 {
			out = append(out, fmt.Sprintf("%s %.0f µs", n, parts[n]))
		}
	}
	return strings.Join(out, ", ")
}

// benchPeer is a system of the peers case.
type benchPeer struct {
	name    string
	how     string // how it runs, for the report's note
	skipped string // why it is not measured; "" when it is
	// window measures one mode on the system's database.
	window func(ctx context.Context, m benchPeersMode) (benchPeersWindow, error)
}

// benchPeers measures pgevents (a new topic's default mode, scope
// partition and a sequenced topic), River and PgQ side by side, each on a database of its own
// on the same server: at 1,000 single-event transactions/s from 4 paced
// producers, commit → handler latency, the producers' transactions and
// the machine's CPU per event; at 3,000/s from 16 producers for 10 s, the
// share committed on schedule; and the drain of a preloaded backlog. Each
// system runs only during its own windows (its consumer started before,
// stopped after), the systems taking turns mode by mode, so that drift
// falls on all alike; ratios are taken per repetition.
func benchPeers(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	river, err := benchBuildRiver(ctx, e)
	if err != nil {
		return nil, err
	}
	defer river.close()

	var peers []*benchPeer
	for _, m := range []benchProducerMode{
		{name: "pgevents"},
		{name: "pgevents partition scope", scope: schema.ScopePartition},
		// A sequenced topic's producers take no lock (the sequencer, in
		// the consumer's process, gives the offsets after commit): the
		// candidate for a new topic's default mode.
		{name: "pgevents sequenced", scope: schema.ScopeSequenced},
	} {
		p, db, err := benchPeersPgevents(ctx, e, m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.name, err)
		}
		defer db.close()
		peers = append(peers, p)
	}
	rdb, err := e.newBareDB(ctx)
	if err != nil {
		return nil, err
	}
	defer rdb.close()
	peers = append(peers, &benchPeer{name: "River", how: river.how(),
		window: func(ctx context.Context, m benchPeersMode) (benchPeersWindow, error) {
			return river.window(ctx, e, rdb, m)
		}})
	qdb, err := e.newBareDB(ctx)
	if err != nil {
		return nil, err
	}
	defer qdb.close()
	peers = append(peers, benchPeersPgq(ctx, e, qdb))

	figures := make([]benchPeersFigures, len(peers))
	for i, p := range peers {
		figures[i] = benchPeersFigures{name: p.name, pgevents: strings.HasPrefix(p.name, "pgevents"), how: p.how, skipped: p.skipped,
			runs: make([][]float64, len(benchPeersMeasures)), foreign: make([][]float64, len(benchPeersMeasures))}
		if p.skipped != "" {
			e.logf("peers: %s not measured: %s", p.name, p.skipped)
		}
	}
	measures := slices.Clone(benchPeersMeasures)
	for k := range measures {
		if measures[k].mode == benchPeersDrain {
			measures[k].name = fmt.Sprintf("drain of a preloaded backlog of %s events", benchFormat(float64(e.peersBacklog())))
		}
	}
	_, _, d := e.peersLoad(benchPeersLatency)
	runNote := fmt.Sprintf("each system on a database of its own on the same server; 1,000 tx/s windows of %s, each after a %s warm-up at its rate whose events are handled before it starts; each system's consumer runs only during its own windows, the systems taking turns mode by mode (latency, schedule, drain), %d repetition(s)",
		d, benchPeersWarmup, e.reps)
	for rep := range e.reps {
		for _, m := range benchPeersModes {
			for i, p := range peers {
				if p.skipped != "" {
					continue
				}
				w, err := p.window(ctx, m)
				if err != nil {
					return benchPeersResults(measures, figures, runNote), fmt.Errorf("%s, %s: %w", p.name, m, err)
				}
				for k, ms := range benchPeersMeasures {
					if ms.mode == m {
						figures[i].runs[k] = append(figures[i].runs[k], ms.get(w))
						figures[i].foreign[k] = append(figures[i].foreign[k], w.foreign)
					}
				}
				if m == benchPeersLatency {
					figures[i].parts = append(figures[i].parts, w.parts)
				}
				e.logf("peers: rep %d, %s, %s: %s", rep+1, m, p.name, w.summary(m))
			}
		}
	}
	return benchPeersResults(measures, figures, runNote), nil
}

// summary describes a window for the progress output.
func (w benchPeersWindow) summary(m benchPeersMode) string {
	switch m {
	case benchPeersLatency:
		return fmt.Sprintf("%d events in %.1f s; COMMIT → handler p50 %.2f ms, p99 %.2f ms; call → handler p50 %.2f ms, p99 %.2f ms; producer tx p50 %.2f ms, p99 %.2f ms; CPU/event %.0f µs machine, %.0f µs bench+server; machine %.0f%% busy (%.0f%% other processes); %d of %d offered committed, %d on schedule; CPU/event by part: %s",
			w.events, w.seconds, w.commit[0], w.commit[1], w.call[0], w.call[1], w.tx[0], w.tx[1], w.machineUS, w.ownUS, 100*w.busy, 100*w.foreign,
			w.committed, w.offered, w.onTime, w.partsText())
	case benchPeersSchedule:
		return fmt.Sprintf("%d of %d offered committed, %d on schedule; handled by %.1f s", w.committed, w.offered, w.onTime, w.seconds)
	default:
		return fmt.Sprintf("%d events in %.2f s: %.0f events/s; machine %.0f%% busy (%.0f%% other processes)", w.events, w.seconds, w.drainRate, 100*w.busy, 100*w.foreign)
	}
}

// benchPeersPgevents creates the database of pgevents in mode m (8
// partitions) and returns the system that measures it with an in-process
// consumer group, and the database for the caller to close.
func benchPeersPgevents(ctx context.Context, e *benchEnv, m benchProducerMode) (*benchPeer, *benchDB, error) {
	db, err := e.newModeDB(ctx, benchPeersPartitions, m)
	if err != nil {
		return nil, nil, err
	}
	t, err := schema.LookupTopic(ctx, db.pool, benchTopic)
	if err != nil {
		db.close()
		return nil, nil, err
	}
	ppool, err := db.openPool(ctx, "bench-producer", 18, nil)
	if err != nil {
		db.close()
		return nil, nil, err
	}
	mode := fmt.Sprintf("scope %s, wake %s", t.Scope, t.Wake)
	if m.scope == "" {
		mode = "a new topic's default mode: " + mode
	}
	p := &benchPeer{name: m.name,
		how: fmt.Sprintf("pgevents (%s), %d partitions; producers: pgevents.AppendCommit (BEGIN, then the append pipelined with COMMIT); an in-process consumer group (batchSize %d, pgevents' pool settings) whose handler notes the time it is called",
			mode, benchPeersPartitions, pgevents.DefaultBatchSize)}
	p.window = func(ctx context.Context, mode benchPeersMode) (benchPeersWindow, error) {
		if err := db.ensureSegments(ctx); err != nil {
			return benchPeersWindow{}, err
		}
		marks := newBenchMarks()
		var appended atomic.Int64
		var c *benchConsumer
		start := func(ctx context.Context) error {
			cpool, err := db.openConsumerPool(ctx, benchPeersPartitions)
			if err != nil {
				return err
			}
			hs := &pgevents.Handlers{}
			hs.HandleAll(pgevents.HandlerFunc(func(_ context.Context, _ pgx.Tx, ev *pgevents.Event) error {
				marks.handled(ev.Payload, time.Now())
				return nil
			}))
			c, err = startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: benchPeersGroup, TotalPartitions: benchPeersPartitions, Handlers: hs})
			if err != nil {
				cpool.Close()
				return err
			}
			go func() { <-c.done; cpool.Close() }()
			return nil
		}
		defer func() {
			if c != nil {
				_ = c.stop()
			}
		}()
		caughtUp := func(ctx context.Context) error { return c.waitHandled(ctx, appended.Load(), 2*time.Minute) }
		if mode == benchPeersDrain {
			return benchPeersDrainInProcess(ctx, e, db, ppool, nil, &appended, start, caughtUp)
		}
		if err := start(ctx); err != nil {
			return benchPeersWindow{}, err
		}
		return benchPeersPaced(ctx, e, ppool, mode, benchAppendCommitTx(benchTopic), &appended, marks, caughtUp)
	}
	return p, db, nil
}

// benchPeersPgq returns PgQ as a system of the case on db, or, when PgQ
// cannot be installed there, the system with the reason it is skipped.
// Its ticker and consumer (benchStartPgqLoops, as the pgq case runs them)
// run only during its windows.
func benchPeersPgq(ctx context.Context, e *benchEnv, db *benchDB) *benchPeer {
	loop := benchPeersLoopPgq
	p := &benchPeer{name: "PgQ",
		how: "PgQ"}
	if p.skipped = benchSetupPgq(ctx, e, db, loop); p.skipped != "" {
		return p
	}
	var version string
	if err := db.pool.QueryRow(ctx, `SELECT extversion FROM pg_extension WHERE extname = 'pgq'`).Scan(&version); err != nil {
		p.skipped = err.Error()
		return p
	}
	p.how = fmt.Sprintf("PgQ %s: producers BEGIN, then SELECT pgq.insert_event(queue, type, payload) pipelined with COMMIT; an in-process consumer loops next_batch, get_batch_events (the time noted per row read), finish_batch in one transaction each, and when no batch is ready calls pgq.ticker(queue) itself (ticker_max_lag %s), looking again at once after a tick, after %s otherwise",
		version, loop.maxLag, loop.idle)
	ppool, err := db.openPool(ctx, "bench-producer", 18, nil)
	if err != nil {
		p.skipped = err.Error()
		return p
	}
	p.window = func(ctx context.Context, mode benchPeersMode) (benchPeersWindow, error) {
		marks := newBenchMarks()
		loop.handled = marks.handled
		var q *benchPgqRun
		var appended atomic.Int64
		start := func(ctx context.Context) error {
			var err error
			q, err = benchStartPgqLoops(ctx, db, loop)
			return err
		}
		defer func() {
			if q != nil {
				q.stop()
			}
		}()
		caughtUp := func(ctx context.Context) error {
			q.appended.Store(appended.Load())
			return q.caughtUp(ctx)
		}
		if mode == benchPeersDrain {
			return benchPeersDrainInProcess(ctx, e, db, ppool, benchPgqTx, &appended, start, caughtUp)
		}
		if err := start(ctx); err != nil {
			return benchPeersWindow{}, err
		}
		return benchPeersPaced(ctx, e, ppool, mode, benchPgqTx, &appended, marks, caughtUp)
	}
	return p
}

// benchPeersPaced measures a paced mode of an in-process system whose
// consumer runs: a warm-up at the mode's rate until handled, then the
// window, from the producers' start until every event of the window is
// handled (caughtUp). appended counts the events committed.
func benchPeersPaced(ctx context.Context, e *benchEnv, pool *pgxpool.Pool, m benchPeersMode, txFn benchTxFunc, appended *atomic.Int64,
	marks *benchMarks, caughtUp func(context.Context) error) (benchPeersWindow, error) {
	rate, producers, d := e.peersLoad(m)
	var w benchPeersWindow
	if _, err := (benchLoad{producers: producers, txSize: 1, rate: newBenchRate(rate), txFn: txFn}).run(ctx, pool, benchPeersWarmup, appended); err != nil {
		return w, fmt.Errorf("warm-up: %w", err)
	}
	if err := caughtUp(ctx); err != nil {
		return w, fmt.Errorf("warm-up: %w", err)
	}
	marks.reset()
	sched := &benchSchedule{interval: time.Duration(float64(producers) / rate * float64(time.Second))}
	txTimes := &latency.Recorder{}
	load := benchLoad{producers: producers, txSize: 1, rate: newBenchRate(rate), txFn: txFn, txTimes: txTimes,
		onCommit: func(evs []pgevents.Event, t benchTxTimes) {
			marks.committed(evs, t)
			sched.add(t)
		}}
	r0, ss := e.peersStart(ctx, pool, 0)
	lr, err := load.run(ctx, pool, d, appended)
	if err == nil {
		err = caughtUp(ctx)
	}
	r1, parts := e.peersEnd(ss, 0)
	if err != nil {
		return w, err
	}
	w.setCPU(r0, r1, parts, lr.events)
	w.offered, w.committed, w.onTime = int64(rate*d.Seconds()), lr.events, int64(sched.summary().onTime)
	c := marks.percentiles(false, 0.5, 0.99)
	b := marks.percentiles(true, 0.5, 0.99)
	t50, t99 := txTimes.Take()
	w.commit, w.call, w.tx = [2]float64{c[0], c[1]}, [2]float64{b[0], b[1]}, [2]float64{benchMillis(t50), benchMillis(t99)}
	return w, nil
}

// benchPeersDrainInProcess preloads the backlog with 4 producers of
// 100-event transactions (txFn; nil: pgevents.Append) and vacuums the
// database, then starts the system's consumer (start) and times it until
// it has handled every event (caughtUp).
func benchPeersDrainInProcess(ctx context.Context, e *benchEnv, db *benchDB, pool *pgxpool.Pool, txFn benchTxFunc, appended *atomic.Int64,
	start, caughtUp func(context.Context) error) (benchPeersWindow, error) {
	n := e.peersBacklog()
	var w benchPeersWindow
	lr, err := (benchLoad{producers: 4, txSize: 100, limit: n, txFn: txFn}).run(ctx, pool, 10*time.Minute, appended)
	if err != nil {
		return w, fmt.Errorf("preload: %w", err)
	}
	if lr.events != n {
		return w, fmt.Errorf("preload: appended %d events, want %d", lr.events, n)
	}
	if err := db.exec(ctx, `VACUUM (ANALYZE)`); err != nil {
		return w, err
	}
	r0, ss := e.peersStart(ctx, pool, 0)
	err = start(ctx)
	if err == nil {
		err = caughtUp(ctx)
	}
	r1, parts := e.peersEnd(ss, 0)
	if err != nil {
		return w, err
	}
	w.setCPU(r0, r1, parts, n)
	w.drainRate = float64(n) / w.seconds
	return w, nil
}

// benchPeersMeasure is a figure of the peers case: its name, the mode
// that measures it, and its target where the issue sets one.
type benchPeersMeasure struct {
	name string
	unit string
	mode benchPeersMode
	get  func(benchPeersWindow) float64
	// riverRatio, when set, is the target "pgevents / River ≤ riverRatio".
	riverRatio float64
	// atLeast, when set, is the target of pgevents' own figure.
	atLeast float64
	note    string
	// foreign: each system's row says how busy other processes kept the
	// machine during its windows.
	foreign bool
	// parts: each system's row says where its CPU per event went
	// (benchPeersWindow.parts).
	parts bool
}

// benchMedianParts returns, for each part named in any of runs, the median
// of its figures (0 in a run that does not name it).
func benchMedianParts(runs []map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, r := range runs {
		for n := range r {
			out[n] = 0
		}
	}
	for n := range out {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = r[n]
		}
		out[n] = benchMedian(xs)
	}
	return out
}

// benchPeersMeasures are the figures of the peers case, in the order of
// the report.
var benchPeersMeasures = []benchPeersMeasure{
	{name: "1,000 tx/s, 4 producers: COMMIT returned → handler start, p50", unit: "ms", mode: benchPeersLatency, riverRatio: 0.5,
		get:  func(w benchPeersWindow) float64 { return w.commit[0] },
		note: "from the producer's COMMIT returned to the handler's call, on the clock of the process running both; negative when the consumer is woken before the producer reads the server's answer"},
	{name: "1,000 tx/s, 4 producers: COMMIT returned → handler start, p99", unit: "ms", mode: benchPeersLatency, riverRatio: 1,
		get: func(w benchPeersWindow) float64 { return w.commit[1] }},
	{name: "1,000 tx/s, 4 producers: producer's call → handler start, p50", unit: "ms", mode: benchPeersLatency,
		get:  func(w benchPeersWindow) float64 { return w.call[0] },
		note: "from the producer's call, before its BEGIN (its own transaction included), to the handler's call"},
	{name: "1,000 tx/s, 4 producers: producer's call → handler start, p99", unit: "ms", mode: benchPeersLatency,
		get: func(w benchPeersWindow) float64 { return w.call[1] }},
	{name: "1,000 tx/s, 4 producers: producer transaction BEGIN → COMMIT returned, p50", unit: "ms", mode: benchPeersLatency, riverRatio: 1,
		get:  func(w benchPeersWindow) float64 { return w.tx[0] },
		note: "the producer's whole transaction: connection acquired, BEGIN, the insert, COMMIT returned"},
	{name: "1,000 tx/s, 4 producers: producer transaction BEGIN → COMMIT returned, p99", unit: "ms", mode: benchPeersLatency, riverRatio: 1,
		get: func(w benchPeersWindow) float64 { return w.tx[1] }},
	{name: "1,000 tx/s, 4 producers: machine CPU per event, every process", unit: "µs", mode: benchPeersLatency, riverRatio: 0.7, foreign: true, parts: true,
		get:  func(w benchPeersWindow) float64 { return w.machineUS },
		note: "the machine's busy time (the cores' time less their idle, iowait and steal time in /proc/stat, which this kernel keeps exactly, unlike its tick-sampled busy counters) from the window's start until every event of it was handled, divided by those events: producers, consumer or worker, server, and whatever else ran on the machine meanwhile"},
	{name: "1,000 tx/s, 4 producers: CPU per event, bench, River program and server", unit: "µs", mode: benchPeersLatency,
		get:  func(w benchPeersWindow) float64 { return w.ownUS },
		note: "the same span, counting only the bench process (getrusage), the River program (/proc/<pid>/stat) and the server's processes (the postmaster's tree; 0 with DATABASE_URL): the figure above without other work on the machine"},
	{name: "1,000 tx/s, 4 producers: committed / offered", unit: "ratio", mode: benchPeersLatency,
		get:  func(w benchPeersWindow) float64 { return float64(w.committed) / float64(max(1, w.offered)) },
		note: "transactions committed in the window over rate × window; below 1 when the producers fell behind"},
	{name: "3,000 tx/s, 16 producers, 10 s: committed / offered", unit: "ratio", mode: benchPeersSchedule, atLeast: 0.99,
		get:  func(w benchPeersWindow) float64 { return float64(w.committed) / float64(max(1, w.offered)) },
		note: "transactions committed in the 10 s, on schedule or late, over the 30,000 offered: the issue's figure (River: all of them)"},
	{name: "3,000 tx/s, 16 producers, 10 s: committed on schedule / offered", unit: "ratio", mode: benchPeersSchedule,
		get:  func(w benchPeersWindow) float64 { return float64(w.onTime) / float64(max(1, w.offered)) },
		note: "transactions that committed within one producer interval (16 / 3,000 s = 5.33 ms) of their scheduled start, over the 30,000 offered; paced as every bench producer is (catching up by at most 1 s)"},
	{name: "drain of a preloaded backlog", unit: "events/s", mode: benchPeersDrain, foreign: true,
		get:  func(w benchPeersWindow) float64 { return w.drainRate },
		note: "the backlog preloaded (pgevents and PgQ: 100-event transactions from 4 producers; River: InsertManyFast, 1,000 jobs a call) with the consumer stopped, the database vacuumed and analysed; timed from the consumer's start until it has handled every event"},
}

// benchPeersFigures are one system's figures: per measure, one per
// repetition.
type benchPeersFigures struct {
	name     string
	pgevents bool   // a pgevents system, compared with the others
	how      string // how it runs
	skipped  string // why it was not measured
	runs     [][]float64
	// foreign is, beside each figure of runs, the share of the machine
	// other processes kept busy during its window.
	foreign [][]float64
	// parts holds, per repetition, the latency window's CPU per event by
	// part (benchPeersWindow.parts).
	parts []map[string]float64
}

// benchPeersResults reports the figures: per measure, one row per system
// (a skipped system's row empty, saying why), then each pgevents system
// over each other system, the ratio taken per repetition. runNote, on
// the first row, says how the case ran.
func benchPeersResults(measures []benchPeersMeasure, systems []benchPeersFigures, runNote string) []benchResult {
	var out []benchResult
	for k, m := range measures {
		for i, s := range systems {
			r := newBenchResult("peers", m.name+": "+s.name, m.unit, s.runs[k])
			if k == 0 {
				r = r.noted("%s", s.how)
				if i == 0 && runNote != "" {
					r = r.noted("%s", runNote)
				}
			}
			if m.note != "" && i == 0 {
				r = r.noted("%s", m.note)
			}
			if s.skipped != "" {
				r = r.noted("%s not measured: %s", s.name, s.skipped)
			}
			if m.parts && len(s.parts) > 0 {
				r = r.noted("CPU per event by part, %s (median of the repetitions): %s", s.name, benchPartsText(benchMedianParts(s.parts)))
			}
			if m.foreign && k < len(s.foreign) && len(s.foreign[k]) > 0 {
				r = r.noted("other processes kept the machine %.0f%% busy during the windows of %s (median)", 100*benchMedian(s.foreign[k]), s.name)
			}
			if s.pgevents && m.atLeast > 0 {
				r = r.atLeast(m.atLeast)
			}
			out = append(out, r)
		}
		for _, p := range systems {
			if !p.pgevents {
				continue
			}
			for _, q := range systems {
				if q.pgevents {
					continue
				}
				r := newBenchResult("peers", m.name+": "+p.name+" / "+q.name, "ratio", benchRatios(p.runs[k], q.runs[k]))
				if q.skipped != "" {
					r = r.noted("%s not measured", q.name)
				}
				if q.name == "River" && m.riverRatio > 0 {
					r = r.atMost(m.riverRatio)
				}
				out = append(out, r)
			}
		}
	}
	return out
}
