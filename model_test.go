package pgevents

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

// The randomized failure test: TestFailureModel drives in-process consumers
// (on the production pool settings) with random producer transactions and
// random behaviour per event, under a random failure policy, while an
// operator performs random operations, and then checks the outcome against
// a model of what the guarantees allow.
//
//	go test -run TestFailureModel .                          # the short run of make test (about 40 s)
//	go test -run TestFailureModel -model.soak 30m -timeout 40m .   # a soak: cases for 30 minutes
//	go test -run TestFailureModel -model.seed 1234 -model.load 20s -v .   # one case again
//
// A seed and a load (how long producers run: 8 s in the short run, 20 s in
// a soak) fix a case: its configuration, every producer transaction and
// event behaviour, and the operations and when they happen. A failing case
// prints the command that reruns it. Timing between goroutines is the
// machine's, so a rerun explores the same case, not the same interleaving;
// a failure the model found becomes a focused test that pins the
// interleaving (TestConsumerTakesUpALostAcquisition, say). A failing case
// prints the tail of the consumers' log.
//
// The consumers poll once an hour: after a resume, a dead letter resolved
// and a repartition, once the consumers have observed it, a probe event in
// each partition must be handled within a second (model.probe), which only
// the wake-ups can do. After every operation no group's position may be
// behind one seen before (model.checkPositions): the model resets nothing.
var (
	modelSeed = flag.Uint64("model.seed", 0, "run the failure-model case with this seed only")
	modelSoak = flag.Duration("model.soak", 0, "run failure-model cases for this long (default: the short run)")
	modelLoad = flag.Duration("model.load", 0, "how long a case's producers run (default: 8s, 20s in a soak); a rerun gives the failed case's")
	modelMode = flag.String("model.mode", "", "draw only cases of this mode (counter, sequence, partition, sequenced): the other choices stay the seed's")
)

// modelProbed and modelProbesSkipped count the probes of every case: those
// handled within a second, and those left out (see model.probe).
var modelProbed, modelProbesSkipped atomic.Int64

// behaviour is what an event's handler does, until the event is fixed.
type behaviour string

const (
	behaveOK      behaviour = "ok"
	behaveData    behaviour = "data"    // a class-22 error from PostgreSQL: permanent
	behaveStorm   behaviour = "storm"   // 40001 for its first attempts: transient
	behavePanic   behaviour = "panic"   // permanent
	behaveTimeout behaviour = "timeout" // ignores nothing, never ends: timeouts, then permanent
	behaveSwallow behaviour = "swallow" // a SQL error ignored, nil returned: permanent
	behaveSlow    behaviour = "slow"    // outside work taking a while, then success
	// behaveStmt has the server cancel a statement of its handler for
	// statement_timeout (57014) or, with Lock, lock_timeout (55P03) in its
	// first Storm attempts: a timeout of its unit, which counts towards
	// MaxAttempts when the unit runs alone, then success.
	behaveStmt behaviour = "stmt"
)

// modelLockSQL is the lock a behaveStmt handler with Lock waits for: the
// model's own session holds it for the whole case (two-int keys never
// meet pgevents' bigint ones).
const modelLockSQL = `SELECT pg_advisory_xact_lock(7, 7)`

// modelPayload is every event's payload.
type modelPayload struct {
	Key   string    `json:"k"`
	Do    behaviour `json:"do"`
	Storm int       `json:"storm,omitempty"`
	Lock  bool      `json:"lock,omitempty"`
}

// modelEvent is a committed event as the model knows it.
type modelEvent struct {
	modelPayload
	host   string
	offset int64
	// layout is the topic's layout version when the event was appended:
	// a host's events are handled in (layout, offset) order, since a host
	// is in one partition per layout and offsets are commit-ordered per
	// partition.
	layout int
}

// modelCase is one case's configuration, drawn from its seed.
type modelCase struct {
	seed        uint64
	partitions  int
	policy      FailurePolicy
	batchSize   int
	replicas    int
	mode        string // counter, sequence (scope topic), partition or sequenced (scope)
	maxAttempts int
	breaker     int
	producers   int
	load        time.Duration
}

func (mc modelCase) String() string {
	return fmt.Sprintf("seed=%d partitions=%d policy=%s batchSize=%d replicas=%d mode=%s maxAttempts=%d maxDeadLetters=%d producers=%d load=%s",
		mc.seed, mc.partitions, mc.policy, mc.batchSize, mc.replicas, mc.mode, mc.maxAttempts, mc.breaker, mc.producers, mc.load)
}

func drawCase(seed uint64, load time.Duration) modelCase {
	mc := drawChoices(seed, load)
	if *modelMode != "" {
		mc.mode = *modelMode
	}
	return mc
}

// drawChoices draws a case's choices from its seed.
func drawChoices(seed uint64, load time.Duration) modelCase {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	pick := func(xs ...int) int { return xs[r.IntN(len(xs))] }
	mc := modelCase{
		seed:        seed,
		partitions:  pick(1, 2, 3, 4, 6),
		policy:      []FailurePolicy{PolicyDeadLetter, PolicyParkHost, PolicyHalt}[r.IntN(3)],
		batchSize:   pick(1, 3, 7, 20, 50),
		replicas:    pick(1, 2),
		mode:        []string{schema.AllocationCounter, schema.AllocationSequence, schema.ScopePartition}[r.IntN(3)],
		maxAttempts: pick(1, 2, 3),
		breaker:     -1,
		producers:   pick(2, 3, 4),
		load:        load,
	}
	if r.IntN(4) == 0 {
		mc.breaker = pick(3, 5, 8)
	}
	// Drawn last, so that a seed drawn before sequenced topics existed
	// keeps its other choices.
	if mc.mode == schema.ScopePartition && r.IntN(2) == 0 {
		mc.mode = schema.ScopeSequenced
	}
	return mc
}

// TestFailureModel runs random cases of failures and operations and checks
// the guarantees against a model; see the comment above for how to run it.
func TestFailureModel(t *testing.T) {
	t.Parallel()
	budget, load := 25*time.Second, 8*time.Second
	if *modelSoak > 0 {
		budget, load = *modelSoak, 20*time.Second
	}
	if *modelLoad > 0 {
		load = *modelLoad
	}
	if *modelSeed != 0 {
		runModelCase(t, drawCase(*modelSeed, load))
		return
	}
	start := time.Now()
	base := uint64(start.UnixNano())
	var cases, ops atomic.Int64
	for lane := range 2 {
		t.Run(fmt.Sprintf("lane%d", lane), func(t *testing.T) {
			t.Parallel()
			for i := uint64(0); time.Since(start) < budget; i++ {
				mc := drawCase(base+uint64(lane)<<32+i, load)
				if !t.Run(fmt.Sprint(mc.seed), func(t *testing.T) { ops.Add(int64(runModelCase(t, mc))) }) {
					return
				}
				cases.Add(1)
			}
		})
	}
	t.Cleanup(func() {
		t.Logf("%d cases, %d operations, %d probes handled within 1s (%d left out) in %s", cases.Load(), ops.Load(),
			modelProbed.Load(), modelProbesSkipped.Load(), time.Since(start).Round(time.Second))
	})
}

// model is one case's world: the database, the consumers, what producers
// committed and what the operator did.
type model struct {
	t      *testing.T
	mc     modelCase
	ctx    context.Context
	pool   *pgxpool.Pool // producers and checks
	log    zerolog.Logger
	logBuf *tailWriter

	fixed atomic.Bool // a fix for every behaviour is deployed

	mu        sync.Mutex
	committed map[string]modelEvent // by event key
	calls     map[string]int        // handler calls by event key
	attempts  map[string]int        // storm attempts by event key
	fixedKeys map[string]bool
	resolved  map[string]bool // keys of dead-lettered events replayed or discarded
	discarded map[string]bool // keys of discarded events
	opsDone   []string

	consumers  []*modelConsumer
	nextID     int
	partitions int

	// gate is held for reading by a producer's transaction and for
	// writing by a probe round: the probes are the only events appended
	// while they are awaited, so nothing but the probe itself can wake
	// its partition.
	gate sync.RWMutex
	// probeN numbers the probes; probed and probesSkipped count the
	// probes awaited and those left out (why, by reason).
	probeN        int
	probed        int
	probesSkipped map[string]int
	// positions is the highest position seen of each group in each
	// partition: a position never moves backwards (the model resets
	// nothing).
	positions map[string]map[int]int64
}

// modelConsumer is one in-process replica of the main group, or the ghost.
type modelConsumer struct {
	c      *Consumer
	pool   *pgxpool.Pool
	app    string
	cancel context.CancelFunc
	done   chan error
}

const (
	modelHandledTable = `CREATE TABLE public.handled (
    seq            bigint GENERATED ALWAYS AS IDENTITY,
    group_id       text NOT NULL,
    c_offset       bigint NOT NULL,
    k              text NOT NULL,
    host_id        text NOT NULL,
    partition_id   int NOT NULL,
    transaction_id bigint NOT NULL,
    consumer_tx    bigint NOT NULL DEFAULT txid_current()
)`
	modelRecordSQL = `INSERT INTO handled (group_id, c_offset, k, host_id, partition_id, transaction_id) VALUES ($1, $2, $3, $4, $5, $6)`
)

func runModelCase(t *testing.T, mc modelCase) (ops int) {
	t.Logf("case %s", mc)
	defer func() {
		if t.Failed() {
			t.Logf("FAILED case %s\nrerun: go test -run 'TestFailureModel' -model.seed %d -model.load %s -model.mode %s -v .", mc, mc.seed, mc.load, mc.mode)
		}
	}()
	ctx := context.Background()
	scope := schema.ScopeTopic
	if mc.mode == schema.ScopePartition || mc.mode == schema.ScopeSequenced {
		scope = mc.mode
	}
	m := &model{
		t: t, mc: mc, ctx: ctx, pool: pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: mc.partitions, Scope: scope}),
		committed: map[string]modelEvent{}, calls: map[string]int{}, attempts: map[string]int{},
		fixedKeys: map[string]bool{}, resolved: map[string]bool{}, discarded: map[string]bool{},
		partitions: mc.partitions, probesSkipped: map[string]int{}, positions: map[string]map[int]int64{},
	}
	// The consumers' log (info and above) is kept in memory and its tail
	// printed when the case fails: the case makes handlers fail on purpose,
	// so a passing case's log is noise.
	m.logBuf = &tailWriter{max: 4000}
	// Every line, at every level, is checked (logtest).
	m.log = zerolog.New(zerolog.MultiLevelWriter(logtest.New(t), &zerolog.FilteredLevelWriter{
		Level: zerolog.InfoLevel,
		Writer: zerolog.LevelWriterAdapter{Writer: zerolog.ConsoleWriter{Out: m.logBuf, NoColor: true, FormatTimestamp: func(any) string {
			return time.Now().Format("15:04:05.000") // when the line is written, to the millisecond
		}}},
	})).Level(zerolog.TraceLevel).With().Timestamp().Uint64("seed", mc.seed).Logger()
	defer func() {
		if t.Failed() {
			t.Logf("the consumers' log, last %d lines:\n%s", m.logBuf.max, m.logBuf.String())
		}
	}()
	// Small segments and immediate retention: segments go while the case
	// runs, behind the ghost group.
	pgtest.ResizeSegments(t, m.pool, 1, 1000)
	mustExec(t, m.pool, modelHandledTable)
	mustExec(t, m.pool, `UPDATE topic_retention SET retention = '1 millisecond'`)
	if mc.mode == schema.AllocationSequence {
		if err := schema.SetAllocation(ctx, m.pool, 1, schema.AllocationSequence); err != nil {
			t.Fatal(err)
		}
	}
	// behaveStmt's lock, held by a session of the model's until the case
	// ends.
	lockConn, err := m.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lockConn.Release()
	if _, err := lockConn.Exec(ctx, `SELECT pg_advisory_lock(7, 7)`); err != nil {
		t.Fatal(err)
	}
	// The ghost group starts with the topic and stops early: it is DEAD
	// while retention goes past it, and comes back at the end.
	ghost := m.start("ghost")
	for range mc.replicas {
		m.consumers = append(m.consumers, m.start("main"))
	}
	// The operations begin once both groups exist: a pause drawn before
	// the main group's first consumer had subscribed (on a loaded machine)
	// failed with "no subscription", as an operator's would.
	pgtest.WaitFor(t, time.Minute, "both groups subscribed", func() bool {
		return queryInt(t, m.pool, `SELECT count(*) FROM subscriptions WHERE topic_id = 1 AND group_id IN ('main', 'ghost')`) == 2
	})

	r := rand.New(rand.NewPCG(mc.seed, 1))
	var stop atomic.Bool
	var wg sync.WaitGroup
	for p := range mc.producers {
		pr := rand.New(rand.NewPCG(mc.seed, uint64(100+p)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				m.gate.RLock()
				m.produce(pr, fmt.Sprintf("p%d-%d", p, n))
				m.gate.RUnlock()
				time.Sleep(time.Duration(2+pr.IntN(8)) * time.Millisecond)
			}
		}()
	}
	// The operations and their times are drawn from the seed up front, each
	// with a random stream of its own, so that a rerun of the seed (with the
	// same -model.load) performs the same operations at the same times.
	var schedule []time.Duration
	for at := time.Duration(0); ; {
		at += time.Duration(200+r.IntN(500)) * time.Millisecond
		if at >= mc.load {
			break
		}
		schedule = append(schedule, at)
	}
	began := time.Now()
	for i, at := range schedule {
		time.Sleep(time.Until(began.Add(at)))
		if t.Failed() {
			break
		}
		if ghost != nil && at >= mc.load/4 {
			m.stop(ghost)
			ghost = nil
			m.op("ghost stopped")
		}
		m.checkPositions(m.operate(rand.New(rand.NewPCG(mc.seed, uint64(1000+i)))))
		ops++
	}
	time.Sleep(time.Until(began.Add(mc.load)))
	stop.Store(true)
	wg.Wait()
	m.heal()
	m.checkPositions("heal")
	m.check()
	m.mu.Lock()
	defer m.mu.Unlock()
	modelProbed.Add(int64(m.probed))
	for _, n := range m.probesSkipped {
		modelProbesSkipped.Add(int64(n))
	}
	return ops
}

// start runs a consumer of group on its own pool with the production
// settings.
func (m *model) start(group string) *modelConsumer {
	m.t.Helper()
	m.nextID++
	mcon := &modelConsumer{app: fmt.Sprintf("model-%s-%d", group, m.nextID), done: make(chan error, 1)}
	mcon.pool = consumerPool(m.t, m.pool, m.partitions, func(pc *pgxpool.Config) {
		pc.ConnConfig.RuntimeParams["application_name"] = mcon.app
	})
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error { return m.handle(ctx, tx, ev, group) }))
	cfg := Config{
		GroupID: group, TotalPartitions: m.partitions, BatchSize: m.mc.batchSize, Handlers: hs, Logger: &m.log,
		OnPermanentFailure: m.mc.policy, MaxAttempts: m.mc.maxAttempts, MaxDeadLetters: m.mc.breaker,
		HandlerTimeout: 150 * time.Millisecond, RetryInitial: 5 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		WaitPeriod: time.Hour, LeaseDuration: 400 * time.Millisecond, ShutdownTimeout: 2 * time.Second,
		MaintenanceInterval: 100 * time.Millisecond, DeadAfter: time.Minute, Schema: pgtest.Schema(),
	}
	if group == "ghost" {
		// The ghost never fails: a budget that a loaded machine cannot
		// exhaust, so that none of its events is dead-lettered.
		cfg.OnPermanentFailure, cfg.MaxDeadLetters, cfg.DeadAfter = PolicyDeadLetter, -1, 300*time.Millisecond
		cfg.HandlerTimeout = 20 * time.Second
	}
	if m.fixed.Load() {
		// The fix deployed by heal: handlers that succeed, and a budget a
		// loaded machine cannot exhaust either (a unit of a few hundred
		// events missed 150 ms three times with the load average at 16 on
		// 2 cores, and halted its partition, in a soak).
		cfg.HandlerTimeout = 20 * time.Second
	}
	c, err := NewConsumer(mcon.pool, cfg)
	if err != nil {
		m.t.Fatal(err)
	}
	mcon.c = c
	ctx, cancel := context.WithCancel(m.ctx)
	mcon.cancel = cancel
	go func() { mcon.done <- c.Run(ctx) }()
	m.t.Cleanup(func() { m.stop(mcon) })
	// Started: past the check of its partition count against the topic's
	// (or ended). The next operation may repartition: a consumer that had
	// not checked yet on a loaded machine found the new count and refused
	// to run, as one started with an outdated totalPartitions must.
	pgtest.WaitFor(m.t, time.Minute, mcon.app+" started", func() bool {
		return c.rt.Load() != nil || len(mcon.done) > 0
	})
	return mcon
}

// stop stops a consumer and waits for it.
func (m *model) stop(mcon *modelConsumer) {
	if mcon.cancel == nil {
		return
	}
	mcon.cancel()
	mcon.cancel = nil
	select {
	case err := <-mcon.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			m.t.Errorf("consumer %s: %v", mcon.app, err)
		}
	case <-time.After(30 * time.Second):
		m.t.Errorf("consumer %s did not stop", mcon.app)
	}
}

// crash ends a consumer as kill -9 would: its sessions are terminated
// mid-batch, nothing is released. Only this case's database: lanes run
// side by side, and their consumers have the same names (a lane's kill of
// model-main-2 once ended the other lane's model-main-2 in its first
// statement, a crash that lane never knew of). The termination is in the
// aggregate's FILTER, evaluated only for the rows the WHERE kept: in the
// WHERE, the plan ran it on pg_stat_get_activity's rows before the join
// that filters by database, and a lane's crash of model-main-6 ended the
// other lane's model-main-6 while it started (its Run failed, and the
// soak with it).
func (m *model) crash(mcon *modelConsumer) {
	var killed string
	err := m.pool.QueryRow(m.ctx, `SELECT coalesce(string_agg(application_name || '/' || pid, ' ') FILTER (WHERE pg_terminate_backend(pid)), '')
		FROM pg_stat_activity WHERE datname = current_database() AND (application_name = $1 OR pid IN (SELECT b.pid FROM batch_backends($2) b))`,
		mcon.app, mcon.c.ReplicaID()).Scan(&killed)
	if err != nil {
		m.t.Error(err)
	}
	m.op("kill -9 of %s (%s)", mcon.app, killed)
	mcon.cancel()
	mcon.cancel = nil
	select {
	case <-mcon.done: // whatever it says: it crashed
	case <-time.After(30 * time.Second):
		m.t.Errorf("crashed consumer %s did not stop", mcon.app)
	}
}

// produce appends one random transaction, and remembers it if it commits.
func (m *model) produce(r *rand.Rand, tag string) {
	n := 1 + r.IntN(3)
	switch k := r.IntN(10); {
	case k >= 9:
		n = 13 + r.IntN(28)
	case k >= 6:
		n = 4 + r.IntN(9)
	}
	evs := make([]Event, n)
	pays := make([]modelPayload, n)
	for i := range evs {
		p := modelPayload{Key: fmt.Sprintf("%s-%d", tag, i), Do: behaveOK}
		switch x := r.IntN(1000); {
		case x < 20:
			p.Do = behaveData
		case x < 50:
			p.Do, p.Storm = behaveStorm, 1+r.IntN(3)
		case x < 60:
			p.Do = behavePanic
		case x < 63:
			p.Do = behaveTimeout
		case x < 78:
			p.Do = behaveSwallow
		case x < 110:
			p.Do = behaveSlow
		case x < 125:
			p.Do, p.Storm, p.Lock = behaveStmt, 1+r.IntN(4), r.IntN(2) == 0
		}
		b, _ := json.Marshal(p)
		host := fmt.Sprintf("h%d", r.IntN(10))
		evs[i] = Event{HostID: host, UserID: fmt.Sprintf("u%d", r.IntN(3)), EventType: "model", Payload: b}
		pays[i] = p
	}
	rollback := r.IntN(100) < 15
	tx, err := m.pool.Begin(m.ctx)
	if err != nil {
		m.t.Error(err)
		return
	}
	defer tx.Rollback(m.ctx) //nolint:errcheck // no-op after Commit
	offs, err := Append(m.ctx, tx, evs...)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			err = fmt.Errorf("%w (detail: %s)", err, pgErr.Detail)
		}
		m.t.Error(err)
		return
	}
	if rollback {
		return
	}
	// The layout cannot change before this transaction ends: the append
	// holds the topic's append lock, which repartitioning takes. (A
	// sequenced topic's events get their offset and layout at their tick:
	// resolveSequenced reads them.)
	var layout int
	if m.mc.mode == schema.ScopeSequenced {
		offs = slices.Repeat([]int64{-1}, len(offs))
	} else if err := tx.QueryRow(m.ctx, `SELECT max(version) FROM topic_layouts WHERE topic_id = 1`).Scan(&layout); err != nil {
		m.t.Error(err)
		return
	}
	if err := tx.Commit(m.ctx); err != nil {
		m.t.Error(err)
		return
	}
	m.mu.Lock()
	for i, o := range offs {
		m.committed[pays[i].Key] = modelEvent{modelPayload: pays[i], host: evs[i].HostID, offset: o, layout: layout}
	}
	m.mu.Unlock()
}

// handle is every consumer's handler.
func (m *model) handle(ctx context.Context, tx pgx.Tx, ev *Event, group string) error {
	var p modelPayload
	if err := json.Unmarshal(ev.Payload, &p); err != nil {
		return Permanent(err)
	}
	record := func() error {
		_, err := tx.Exec(ctx, modelRecordSQL, group, ev.Offset, p.Key, ev.HostID, ev.PartitionID, ev.TransactionID)
		return err
	}
	m.mu.Lock()
	m.calls[p.Key]++
	fixed := m.fixed.Load() || m.fixedKeys[p.Key] || group == "ghost"
	attempt := 0
	if p.Do == behaveStorm || p.Do == behaveStmt {
		m.attempts[p.Key]++
		attempt = m.attempts[p.Key]
	}
	m.mu.Unlock()
	if fixed {
		return record()
	}
	switch p.Do {
	case behaveData:
		_, err := tx.Exec(ctx, `SELECT 'not a number'::integer`)
		return err
	case behaveStorm:
		if attempt <= p.Storm {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access (model storm)"}
		}
	case behavePanic:
		panic("model: handler bug")
	case behaveTimeout:
		<-ctx.Done()
		return ctx.Err()
	case behaveSwallow:
		_, _ = tx.Exec(ctx, `INSERT INTO handled (group_id, c_offset, k, host_id, partition_id, transaction_id) VALUES (NULL, 0, '', '', 0, 0)`)
		return nil
	case behaveStmt:
		if attempt <= p.Storm {
			// Two statements: a statement's timeout is armed when it
			// starts, so the setting must precede it. The unit's rollback
			// (whole, or to its savepoint) undoes the SET LOCAL.
			set, stmt := `SET LOCAL statement_timeout = '20ms'`, `SELECT pg_sleep(0.2)`
			if p.Lock {
				set, stmt = `SET LOCAL lock_timeout = '20ms'`, modelLockSQL
			}
			if _, err := tx.Exec(ctx, set); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, stmt)
			if err == nil {
				err = fmt.Errorf("model: %s did not time out", stmt)
			}
			return err
		}
	case behaveSlow:
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return record()
}

func (m *model) op(format string, args ...any) {
	m.mu.Lock()
	m.opsDone = append(m.opsDone, fmt.Sprintf(format, args...))
	m.mu.Unlock()
}

// operate performs one random operation, and returns what it did. After
// an operation that makes partitions eligible again (a resume, a dead
// letter resolved, which unhalts or releases, a repartition) and once the
// consumers have observed it, a probe in each partition must be handled
// within a second: the consumers poll once an hour, so only the wake-up of
// the change and the probe's own notification can bring it.
func (m *model) operate(r *rand.Rand) string {
	switch x := r.IntN(100); {
	case x < 25:
		return m.resolveOne(r, true)
	case x < 40:
		return m.resolveOne(r, false)
	case x < 50:
		if _, err := store.SetState(m.ctx, m.pool, "main", 1, store.StatePaused); err != nil {
			m.t.Error(err)
			return "pause"
		}
		time.Sleep(time.Duration(100+r.IntN(300)) * time.Millisecond)
		if _, err := store.SetState(m.ctx, m.pool, "main", 1, store.StateActive); err != nil {
			m.t.Error(err)
		}
		m.op("pause, resume")
		// Observed: no running consumer of the group is paused.
		m.probe("pause, resume", func() bool {
			for _, mcon := range m.consumers {
				if mcon.cancel != nil && mcon.c.paused.Load() {
					return false
				}
			}
			return true
		})
		return "pause, resume"
	case x < 58:
		n := 1 + r.IntN(6)
		if n == m.partitions {
			return "no repartition"
		}
		// A repartition whose segments are left to maintenance (a lock not
		// granted within a second, under load) stands: count it as done.
		var pending *schema.SegmentsPendingError
		if _, err := schema.Repartition(m.ctx, m.pool, 1, n); err != nil && !errors.As(err, &pending) {
			m.t.Error(err)
			return "repartition"
		}
		op := fmt.Sprintf("repartition %d -> %d", m.partitions, n)
		m.op("%s", op)
		m.partitions = n
		// Observed: every running consumer runs the new layout.
		version := int(queryInt(m.t, m.pool, `SELECT max(version) FROM topic_layouts WHERE topic_id = 1`))
		m.probe(op, func() bool {
			if int(queryInt(m.t, m.pool, `SELECT coalesce((SELECT version FROM group_layouts WHERE group_id = 'main' AND topic_id = 1), 0)`)) == version {
				m.followLayout()
			}
			for _, mcon := range m.consumers {
				if rt := mcon.c.rt.Load(); mcon.cancel != nil && (rt == nil || int(rt.layout.Version) != version) {
					return false
				}
			}
			return true
		})
		return op
	case x < 70:
		i := r.IntN(len(m.consumers))
		m.crash(m.consumers[i])
		m.consumers[i] = m.start("main")
		m.op("restarted as %s", m.consumers[i].app)
		return "restart of " + m.consumers[i].app
	}
	return "nothing"
}

// probe waits until the consumers have observed op, then appends one
// event (of a host of its own) to each partition and requires each to be
// handled within a second of its partition being otherwise caught up:
// every event before it handled or set aside (dead-lettered, parked). A
// change not observed within 8 s (a resume is seen at the next heartbeat,
// within 5 s), a group paused by its breaker or still on an older layout,
// a halted partition, or one that does not catch up within 15 s (a backlog
// of failing events) is left out and counted. The probes are committed events like the others: the
// model checks them at the end.
func (m *model) probe(op string, observed func() bool) {
	t := m.t
	skip := func(why string, n int) {
		m.mu.Lock()
		m.probesSkipped[why] += n
		m.mu.Unlock()
	}
	groupPaused := func() bool {
		state, err := store.SubscriptionState(m.ctx, m.pool, "main", 1)
		return err == nil && state == store.StatePaused
	}
	for deadline := time.Now().Add(8 * time.Second); !observed(); time.Sleep(5 * time.Millisecond) {
		if groupPaused() {
			skip("group paused", m.partitions)
			return
		}
		if time.Now().After(deadline) || t.Failed() {
			skip("not observed", m.partitions)
			return
		}
	}
	m.followLayout()
	m.gate.Lock()
	defer m.gate.Unlock()
	// A group still finishing an older layout (a halted partition there,
	// a backlog) handles nothing of the new one yet: no probe.
	if queryInt(t, m.pool, `SELECT (coalesce((SELECT version FROM group_layouts WHERE group_id = 'main' AND topic_id = 1), 0)
		< (SELECT max(version) FROM topic_layouts WHERE topic_id = 1))::int`) == 1 {
		skip("group on an older layout", m.partitions)
		return
	}
	type pending struct {
		partition int
		key       string
		offset    int64
		settled   time.Time // when every event before it was dealt with
	}
	var probes []*pending
	for p := range m.partitions {
		m.mu.Lock()
		m.probeN++
		key := fmt.Sprintf("probe%d", m.probeN)
		m.mu.Unlock()
		var host string
		if err := m.pool.QueryRow(m.ctx, `SELECT h FROM (SELECT $1 || '-' || i AS h FROM generate_series(0, 9999) i) s
			WHERE event_partition(h, $2) = $3 LIMIT 1`, key, m.partitions, p).Scan(&host); err != nil {
			t.Errorf("a host of partition %d: %v", p, err)
			return
		}
		pay := modelPayload{Key: key, Do: behaveOK}
		b, _ := json.Marshal(pay)
		tx, err := m.pool.Begin(m.ctx)
		if err != nil {
			t.Error(err)
			return
		}
		offs, err := Append(m.ctx, tx, Event{HostID: host, UserID: "probe", EventType: "model", Payload: b})
		var layout, part int
		if err == nil && m.mc.mode != schema.ScopeSequenced {
			err = tx.QueryRow(m.ctx, `SELECT (SELECT max(version) FROM topic_layouts WHERE topic_id = 1), partition_id
				FROM outbox_message_t WHERE topic_id = 1 AND c_offset = $1 AND host_id = $2`, offs[0], host).Scan(&layout, &part)
		}
		if err == nil {
			err = tx.Commit(m.ctx)
		}
		if err == nil && m.mc.mode == schema.ScopeSequenced {
			// Sequenced: its offset, partition and layout once a tick moved it.
			var found bool
			pgtest.WaitFor(t, 15*time.Second, "probe "+key+" sequenced", func() bool {
				found = m.pool.QueryRow(m.ctx, `SELECT c_offset, partition_id, (SELECT max(l.version) FROM topic_layouts l
					WHERE l.topic_id = 1 AND layout_start(1, l.version, m.partition_id) <= m.c_offset)
					FROM outbox_message_t m WHERE topic_id = 1 AND payload->>'k' = $1`, key).Scan(&offs[0], &part, &layout) == nil
				return found
			})
		}
		if err != nil {
			_ = tx.Rollback(m.ctx)
			t.Errorf("probe in partition %d: %v", p, err)
			return
		}
		if part != p {
			t.Errorf("probe host %s went to partition %d, not %d", host, part, p)
		}
		m.mu.Lock()
		m.committed[key] = modelEvent{modelPayload: pay, host: host, offset: offs[0], layout: layout}
		m.mu.Unlock()
		probes = append(probes, &pending{partition: p, key: key, offset: offs[0]})
	}
	giveUp := time.Now().Add(15 * time.Second)
	for len(probes) > 0 && !t.Failed() {
		now := time.Now()
		left := probes[:0]
		for _, pr := range probes {
			var handled, halted bool
			var before int64
			err := m.pool.QueryRow(m.ctx, `SELECT
				EXISTS (SELECT 1 FROM handled WHERE group_id = 'main' AND k = $1),
				EXISTS (SELECT 1 FROM partition_halts WHERE group_id = 'main' AND topic_id = 1 AND partition_id = $2),
				(SELECT count(*) FROM outbox_message_t m WHERE m.topic_id = 1 AND m.partition_id = $2 AND m.c_offset < $3
				   AND m.c_offset >= coalesce((SELECT next_offset FROM consumer_offsets o
				                                WHERE o.group_id = 'main' AND o.topic_id = 1 AND o.partition_id = $2), 0))`,
				pr.key, pr.partition, pr.offset).Scan(&handled, &halted, &before)
			switch {
			case err != nil:
				t.Errorf("probe in partition %d: %v", pr.partition, err)
				return
			case handled:
				m.mu.Lock()
				m.probed++
				m.mu.Unlock()
			case halted:
				skip("partition halted", 1)
			case before > 0:
				pr.settled = time.Time{} // a batch before it rolled back
				left = append(left, pr)
			case pr.settled.IsZero():
				pr.settled = now
				left = append(left, pr)
			case now.Sub(pr.settled) > time.Second:
				if groupPaused() {
					skip("group paused", 1)
					continue
				}
				t.Errorf("stall after %s: probe in partition %d not handled within 1s (offset %d, key %s); %s; operations: %s\nworker goroutines:\n%s",
					op, pr.partition, pr.offset, pr.key, m.partitionState(pr.partition), strings.Join(m.opsDone, "; "), workerStacks())
			default:
				left = append(left, pr)
			}
		}
		probes = left
		if len(probes) > 0 && time.Now().After(giveUp) {
			skip("not caught up", len(probes))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// followLayout waits until every running consumer runs the layout the
// group is on, and fails the case when one still runs a layout the group
// has left after 5 s: the replica that moves the group on tells the
// others at the switch's commit (a notification naming no partition makes
// them poll, and the poll follows the group), so none waits for its poll,
// which is an hour away here, while the new layout's partitions the
// balance leaves to it go unowned.
func (m *model) followLayout() {
	lagging := func() []*modelConsumer {
		group := int(queryInt(m.t, m.pool, `SELECT coalesce((SELECT version FROM group_layouts WHERE group_id = 'main' AND topic_id = 1), 0)`))
		var out []*modelConsumer
		for _, mcon := range m.consumers {
			if rt := mcon.c.rt.Load(); mcon.cancel != nil && rt != nil && int(rt.layout.Version) < group {
				out = append(out, mcon)
			}
		}
		return out
	}
	for deadline := time.Now().Add(5 * time.Second); len(lagging()) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			for _, mcon := range lagging() {
				m.t.Errorf("%s still runs layout %d 5 s after the group left it: nothing told it to follow",
					mcon.app, mcon.c.rt.Load().layout.Version)
			}
			return
		}
	}
}

// partitionState describes partition p of the main group for a stall's
// report: its lease, and each running consumer's worker there.
func (m *model) partitionState(p int) string {
	var lease string
	_ = m.pool.QueryRow(m.ctx, `SELECT coalesce((SELECT format('lease owner %s epoch %s %s, position %s, tail %s', nullif(owner, ''), epoch,
			CASE WHEN expires_at > clock_timestamp() THEN 'live' ELSE 'expired' END,
			(SELECT next_offset FROM consumer_offsets o WHERE o.group_id = 'main' AND o.topic_id = 1 AND o.partition_id = $1),
			(SELECT max(c_offset) FROM partition_tails t WHERE t.topic_id = 1 AND t.partition_id = $1))
		FROM partition_leases WHERE group_id = 'main' AND topic_id = 1 AND partition_id = $1), 'no lease')`, p).Scan(&lease)
	out := []string{lease}
	for _, mcon := range m.consumers {
		if mcon.cancel == nil {
			continue
		}
		rt := mcon.c.rt.Load()
		if rt == nil || p >= len(rt.workers) {
			out = append(out, fmt.Sprintf("%s (%s): no worker", mcon.app, mcon.c.ReplicaID()))
			continue
		}
		w := rt.workers[p]
		out = append(out, fmt.Sprintf("%s (%s, layout %d, paused %v): epoch %d next %d highest %d halted %v in flight %v",
			mcon.app, mcon.c.ReplicaID(), rt.layout.Version, mcon.c.paused.Load(), w.epoch.Load(), w.next.Load(), w.highest.Load(),
			w.halted.Load(), w.inFlight.Load()))
	}
	var activity string
	_ = m.pool.QueryRow(m.ctx, `SELECT string_agg(format('%s %s %s/%s %s blocked by %s: %s', pid, application_name, wait_event_type, wait_event, state,
		pg_blocking_pids(pid), left(regexp_replace(query, '\s+', ' ', 'g'), 160)), E'\n')
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'`).Scan(&activity)
	out = append(out, "activity:\n"+activity)
	return strings.Join(out, "; ")
}

// resolveSequenced fills in the offsets and layouts of a sequenced topic's
// committed events, which their ticks assigned: from the log, or, for an
// event retention removed since, from the groups that handled it (the
// check then compares the groups' offsets with each other). An event
// neither in the log nor handled keeps offset -1: the check reports it
// missing, unless its dead letter was discarded.
func (m *model) resolveSequenced() {
	rows, err := m.pool.Query(m.ctx, `SELECT x.k, x.c_offset, (SELECT max(l.version) FROM topic_layouts l
		WHERE l.topic_id = 1 AND layout_start(1, l.version, x.partition_id) <= x.c_offset)
		FROM (SELECT DISTINCT ON (k) k, c_offset, partition_id FROM (
		        SELECT payload->>'k' AS k, c_offset, partition_id, 0 AS pref FROM outbox_message_t WHERE topic_id = 1
		        UNION ALL SELECT k, c_offset, partition_id, 1 FROM handled) u
		      ORDER BY k, pref) x`)
	if err != nil {
		m.t.Fatal(err)
	}
	var k string
	var off int64
	var layout int
	if _, err := pgx.ForEachRow(rows, []any{&k, &off, &layout}, func() error {
		if e, ok := m.committed[k]; ok {
			e.offset, e.layout = off, layout
			m.committed[k] = e
		}
		return nil
	}); err != nil {
		m.t.Fatal(err)
	}
}

// checkPositions fails the case when a group's position in a partition
// is behind one seen before: only a reset moves a position backwards, and
// the model resets nothing.
func (m *model) checkPositions(op string) {
	rows, err := m.pool.Query(m.ctx, `SELECT group_id, partition_id, next_offset FROM consumer_offsets WHERE topic_id = 1`)
	if err != nil {
		m.t.Error(err)
		return
	}
	var g string
	var p int
	var next int64
	if _, err := pgx.ForEachRow(rows, []any{&g, &p, &next}, func() error {
		if m.positions[g] == nil {
			m.positions[g] = map[int]int64{}
		}
		if prev, ok := m.positions[g][p]; ok && next < prev {
			m.t.Errorf("the position of group %s in partition %d moved backwards, from %d to %d, by %s; operations: %s",
				g, p, prev, next, op, strings.Join(m.opsDone, "; "))
		}
		m.positions[g][p] = max(m.positions[g][p], next)
		return nil
	}); err != nil {
		m.t.Error(err)
	}
}

// resolveOne replays (with the fix for its events deployed) or discards a
// random open dead letter of the main group.
func (m *model) resolveOne(r *rand.Rand, replay bool) string {
	dls, err := store.ListDeadLetters(m.ctx, m.pool, "main")
	if err != nil || len(dls) == 0 {
		return "no dead letter"
	}
	op := m.resolve(dls[r.IntN(len(dls))].ID, replay)
	if op != "" {
		m.probe(op, func() bool { return true })
	}
	return op
}

// resolve replays or discards a dead letter, and returns what it did ("" if
// nothing).
func (m *model) resolve(id int64, replay bool) string {
	d, err := store.GetDeadLetter(m.ctx, m.pool, id)
	if err != nil {
		return "" // resolved meanwhile
	}
	m.mu.Lock()
	for _, e := range d.Events {
		var p modelPayload
		_ = json.Unmarshal(e.Payload, &p)
		if replay {
			m.fixedKeys[p.Key] = true
		}
	}
	m.mu.Unlock()
	c := m.consumers[0].c
	if replay {
		_, err = c.ReplayDeadLetter(m.ctx, id)
	} else {
		_, err = c.DiscardDeadLetter(m.ctx, id)
	}
	if err != nil {
		// A released parked event may fail in turn: nothing changed.
		m.op("dead letter %d not resolved: %v", id, err)
		return ""
	}
	m.mu.Lock()
	for _, e := range d.Events {
		var p modelPayload
		_ = json.Unmarshal(e.Payload, &p)
		m.resolved[p.Key] = true
		if !replay {
			m.discarded[p.Key] = true
		}
	}
	m.mu.Unlock()
	op := fmt.Sprintf("dead letter %d (partition %d, offsets %d-%d) %s", id, d.Partition, d.FirstOffset, d.LastOffset, map[bool]string{true: "replayed", false: "discarded"}[replay])
	m.op("%s", op)
	return op
}

// heal deploys a fix for everything, checks the halts, restarts the
// replicas, replays what is dead-lettered and waits until every committed
// event has been dealt with.
func (m *model) heal() {
	t := m.t
	m.fixed.Store(true)
	if _, err := store.SetState(m.ctx, m.pool, "main", 1, store.StateActive); err != nil && !errors.Is(err, store.ErrTransition) {
		t.Error(err)
	}
	// A halted partition says so, and stops where it says.
	for _, mcon := range m.consumers {
		if rt := mcon.c.rt.Load(); rt != nil {
			for p, w := range rt.workers {
				if !w.halted.Load() {
					continue
				}
				var at, next, between int64
				err := m.pool.QueryRow(m.ctx, `SELECT h.c_offset, o.next_offset,
					(SELECT count(*) FROM outbox_message_t m WHERE m.topic_id = 1 AND m.partition_id = h.partition_id
					   AND m.c_offset >= o.next_offset AND m.c_offset < h.c_offset)
					FROM partition_halts h
					JOIN consumer_offsets o USING (group_id, topic_id, partition_id)
					WHERE h.group_id = 'main' AND h.partition_id = $1`, p).Scan(&at, &next, &between)
				if err != nil {
					t.Errorf("partition %d is halted without a partition_halts row: %v", p, err)
				} else if between != 0 {
					t.Errorf("partition %d halted at %d but its position is %d, with %d events between", p, at, next, between)
				}
			}
		}
	}
	for i, mcon := range m.consumers {
		m.stop(mcon)
		m.consumers[i] = m.start("main")
	}
	ghost := m.start("ghost")
	m.mu.Lock()
	total := int64(len(m.committed))
	m.mu.Unlock()
	// Healed when everything is handled; stalled when nothing moved for a
	// minute (a group draining tens of thousands of events one per batch
	// on a loaded machine takes longer than a minute, and is not stalled:
	// two soak cases were reported so, at load 16 on 2 cores), or after
	// ten minutes in all.
	deadline, last := time.Now().Add(60*time.Second), int64(-1)
	giveUp := time.Now().Add(10 * time.Minute)
	for i := 0; ; i++ {
		// Healing is not probed: the model polls every consumer twice a
		// second, as the consumers of the short poll did. The group's
		// move to its next layout (Consumer.checkLayout) runs in the poll:
		// with the poll at an hour, a group whose last old-layout
		// partition reached its cut without a poll (an unhalted or
		// replayed partition) stays on the old layout.
		if i%10 == 0 {
			for _, mcon := range append(slices.Clone(m.consumers), ghost) {
				mcon.c.pollNow(WakePoll)
			}
		}
		dls, err := store.ListDeadLetters(m.ctx, m.pool, "main")
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dls {
			m.resolve(d.ID, true)
		}
		m.mu.Lock()
		want := total - int64(len(m.discarded))
		m.mu.Unlock()
		got := queryInt(t, m.pool, `SELECT count(*) FROM handled WHERE group_id = 'main'`)
		ghostGot := queryInt(t, m.pool, `SELECT count(*) FROM handled WHERE group_id = 'ghost'`)
		ghostSkipped := queryInt(t, m.pool, `SELECT coalesce(sum(skipped), 0) FROM retention_skips WHERE group_id = 'ghost'`)
		if got >= want && len(dls) == 0 && ghostGot+ghostSkipped >= total {
			break
		}
		if progress := got + ghostGot + ghostSkipped; progress > last {
			last, deadline = progress, time.Now().Add(60*time.Second)
		}
		if time.Now().After(deadline) || time.Now().After(giveUp) {
			// The goroutines first, as the stall left them (the report
			// below holds the model's lock, which handlers wait for).
			stacks := workerStacks()
			handledKeys := map[string]map[string]bool{"main": {}, "ghost": {}}
			if rows, err := m.pool.Query(m.ctx, `SELECT DISTINCT group_id, k FROM handled WHERE group_id IN ('main', 'ghost')`); err == nil {
				var g, k string
				_, _ = pgx.ForEachRow(rows, []any{&g, &k}, func() error { handledKeys[g][k] = true; return nil })
			}
			m.mu.Lock()
			var unhandled []string
			for k := range m.committed {
				if !m.discarded[k] && !handledKeys["main"][k] {
					unhandled = append(unhandled, fmt.Sprintf("%s@%d/%d", k, m.committed[k].layout, m.committed[k].offset))
				}
				if !handledKeys["ghost"][k] {
					unhandled = append(unhandled, fmt.Sprintf("ghost:%s@%d/%d", k, m.committed[k].layout, m.committed[k].offset))
				}
			}
			var ghostDLs string
			_ = m.pool.QueryRow(m.ctx, `SELECT coalesce(string_agg(format('%s %s-%s: %s', partition_id, first_offset, last_offset, error), '; '), '')
				FROM dead_letter_queue WHERE group_id = 'ghost'`).Scan(&ghostDLs)
			unhandled = append(unhandled, "ghost dead letters: "+ghostDLs)
			slices.Sort(unhandled)
			var state string
			_ = m.pool.QueryRow(m.ctx, `SELECT format('parked events %s, parked hosts %s, halts %s, group layout %s of %s, positions %s',
				(SELECT count(*) FROM parked_events), (SELECT string_agg(host_id || '@' || partition_id || '>' || dead_letter_id, ' ') FROM parked_hosts),
				(SELECT count(*) FROM partition_halts), (SELECT version FROM group_layouts WHERE group_id = 'main'),
				(SELECT max(version) FROM topic_layouts), (SELECT string_agg(partition_id || ':' || next_offset, ' ' ORDER BY partition_id)
				FROM consumer_offsets WHERE group_id = 'main'))`).Scan(&state)
			var leases string
			_ = m.pool.QueryRow(m.ctx, `SELECT format('leases %s; replicas %s',
				(SELECT string_agg(format('%s/p%s owner %s epoch %s %s', group_id, partition_id, nullif(owner, ''), epoch,
					CASE WHEN expires_at > clock_timestamp() THEN 'live' ELSE 'expired' END), ', ' ORDER BY group_id, partition_id)
				 FROM partition_leases),
				(SELECT string_agg(format('%s/%s %s', group_id, replica_id, CASE WHEN expires_at > clock_timestamp() THEN 'live' ELSE 'expired' END), ', ')
				 FROM consumer_replicas))`).Scan(&leases)
			state += "; " + leases
			var activity string
			_ = m.pool.QueryRow(m.ctx, `SELECT string_agg(format('%s %s %s/%s %s: %s', pid, application_name, wait_event_type, wait_event, state,
				left(regexp_replace(query, '\s+', ' ', 'g'), 100)), E'\n') FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&activity)
			var workers []string
			for _, mc := range append(m.consumers, ghost) {
				if rt := mc.c.rt.Load(); rt != nil {
					for p, w := range rt.workers {
						workers = append(workers, fmt.Sprintf("%s (%s, layout %d) p%d: epoch %d next %d highest %d halted %v limit %d",
							mc.app, mc.c.ReplicaID(), rt.layout.Version, p, w.epoch.Load(), w.next.Load(), w.highest.Load(), w.halted.Load(), w.limit))
					}
				} else {
					workers = append(workers, mc.app+": no layout run")
				}
			}
			t.Errorf("not healed (nothing handled for 60 s, or 10 minutes in all): main handled %d of %d, %d dead letters open; ghost handled %d + skipped %d of %d; unhandled %v; %s; workers:\n%s\nactivity:\n%s\noperations: %s\nworker goroutines:\n%s",
				got, want, len(dls), ghostGot, ghostSkipped, total, unhandled[max(0, len(unhandled)-30):], state,
				strings.Join(workers, "\n"), activity, strings.Join(m.opsDone, "; "), stacks)
			m.mu.Unlock()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, mcon := range m.consumers {
		m.stop(mcon)
	}
	m.stop(ghost)
}

// check compares the outcome with the model.
func (m *model) check() {
	t := m.t
	if t.Failed() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mc.mode == schema.ScopeSequenced {
		m.resolveSequenced()
	}
	type row struct {
		group, key, host string
		offset           int64
	}
	rows, err := m.pool.Query(m.ctx, `SELECT group_id, c_offset, k, host_id FROM handled ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	var handled []row
	var rw row
	if _, err := pgx.ForEachRow(rows, []any{&rw.group, &rw.offset, &rw.key, &rw.host}, func() error {
		handled = append(handled, rw)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s\noperations: %s", fmt.Sprintf(format, args...), strings.Join(m.opsDone, "; "))
	}
	seen := map[string]map[string]bool{"main": {}, "ghost": {}}
	type pos struct {
		layout int
		offset int64
	}
	lastOfHost := map[string]map[string]pos{"main": {}, "ghost": {}}
	for _, h := range handled {
		e, ok := m.committed[h.key]
		if !ok || e.offset != h.offset || e.host != h.host {
			fail("group %s handled offset %d (key %q, host %s), which no committed transaction appended (%+v)", h.group, h.offset, h.key, h.host, e)
			return
		}
		if seen[h.group][h.key] {
			fail("group %s handled %s (offset %d) twice", h.group, h.key, h.offset)
			return
		}
		seen[h.group][h.key] = true
		if h.group == "main" && m.discarded[h.key] {
			fail("%s (offset %d) was handled although its dead letter was discarded", h.key, h.offset)
			return
		}
		// Order per host: under deadLetter a replayed unit comes late by
		// design; everything else is in (layout, offset) order.
		if m.mc.policy == PolicyDeadLetter && h.group == "main" && m.resolved[h.key] {
			continue
		}
		at := pos{e.layout, e.offset}
		if prev, ok := lastOfHost[h.group][h.host]; ok && (prev.layout > at.layout || prev.layout == at.layout && prev.offset > at.offset) {
			fail("group %s handled %s (layout %d, offset %d) of host %s after layout %d, offset %d", h.group, h.key, at.layout, at.offset, h.host, prev.layout, prev.offset)
			return
		}
		lastOfHost[h.group][h.host] = at
	}
	var missing []string
	for k := range m.committed {
		if !seen["main"][k] && !m.discarded[k] {
			missing = append(missing, k)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		fail("main group: %d committed events neither handled nor discarded, first %v", len(missing), missing[:min(10, len(missing))])
	}
	// The ghost: every event handled, or counted as skipped by retention.
	skipped := queryInt(t, m.pool, `SELECT coalesce(sum(skipped), 0) FROM retention_skips WHERE group_id = 'ghost'`)
	if int64(len(seen["ghost"]))+skipped != int64(len(m.committed)) {
		fail("ghost group: %d handled + %d skipped, want the %d committed", len(seen["ghost"]), skipped, len(m.committed))
	}
	if n := queryInt(t, m.pool, `SELECT coalesce(sum(skipped), 0) FROM retention_skips WHERE group_id = 'main'`); n != 0 {
		fail("retention removed %d events the ACTIVE main group had not handled", n)
	}
	// One consumer transaction per producer transaction and partition.
	if n := queryInt(t, m.pool, `SELECT count(*) FROM (SELECT 1 FROM handled GROUP BY group_id, transaction_id, partition_id
		HAVING count(DISTINCT consumer_tx) > 1) s`); n != 0 {
		var detail string
		_ = m.pool.QueryRow(m.ctx, `SELECT string_agg(format('%s tx %s p%s: %s', h.group_id, h.transaction_id, h.partition_id, h.rows), '; ')
			FROM (SELECT group_id, transaction_id, partition_id,
			             string_agg(format('%s@%s(ctx %s seq %s)', k, c_offset, consumer_tx, seq), ' ' ORDER BY seq) AS rows
			      FROM handled GROUP BY 1, 2, 3 HAVING count(DISTINCT consumer_tx) > 1) h`).Scan(&detail)
		fail("%d producer transactions split across consumer transactions: %s", n, detail)
	}
	// No spin: no event's handler ran more than a bounded number of times.
	worst, worstKey := 0, ""
	for k, n := range m.calls {
		if n > worst {
			worst, worstKey = n, k
		}
	}
	if worst > 200 {
		fail("the handler of %s ran %d times: a failure path spins", worstKey, worst)
	}
	kinds := map[behaviour]int{}
	for _, p := range m.committed {
		kinds[p.Do]++
	}
	keys := make([]string, 0, len(kinds))
	for k, n := range kinds {
		keys = append(keys, fmt.Sprintf("%s:%d", k, n))
	}
	slices.Sort(keys)
	t.Logf("%d committed events (%s), %d handled by main, %d discarded, ghost skipped %d; at most %d calls of one event; %d probes handled within 1s, left out %v; operations: %s",
		len(m.committed), strings.Join(keys, " "), len(seen["main"]), len(m.discarded), skipped, worst, m.probed, m.probesSkipped, strings.Join(m.opsDone, "; "))
}

// tailWriter keeps the last max lines written to it.
type tailWriter struct {
	mu    sync.Mutex
	max   int
	lines []string
	part  []byte
}

func (w *tailWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, b...)
	for {
		i := slices.Index(w.part, '\n')
		if i < 0 {
			break
		}
		w.lines = append(w.lines, string(w.part[:i]))
		w.part = w.part[i+1:]
	}
	if n := len(w.lines) - w.max; n > w.max {
		w.lines = slices.Delete(w.lines, 0, n)
	}
	return len(b), nil
}

// String returns the lines kept.
func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines[max(0, len(w.lines)-w.max):], "\n")
}

// workerStacks returns the stacks of the goroutines of this process that
// run a worker or wait for one (where a stalled partition's worker is).
func workerStacks() string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "pgevents.(*worker)") || strings.Contains(g, "pgevents.(*watcher)") || strings.Contains(g, "pgevents.(*Consumer).poll") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
