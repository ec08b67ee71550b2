package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/cmd/consumer-dev/internal/latency"
)

// benchHostCount is how many hosts (partition keys) the producers spread
// their events over, at random.
const benchHostCount = 10000

// benchHostNames are the host names, made once and shared read-only.
var benchHostNames = sync.OnceValue(func() []string {
	hosts := make([]string, benchHostCount)
	for i := range hosts {
		hosts[i] = "host-" + strconv.Itoa(i)
	}
	return hosts
})

// benchUserNames are the user ids events carry.
var benchUserNames = []string{"user-0", "user-1", "user-2", "user-3", "user-4"}

// benchEvents makes the events of one producer: a random host and user per
// event and a small JSON payload.
type benchEvents struct {
	rng *rand.Rand
	id  int
	seq int64
	buf []pgevents.Event
}

// newBenchEvents returns the event maker of producer id.
func newBenchEvents(id int) *benchEvents {
	return &benchEvents{rng: rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano()))), id: id}
}

// next returns n new events; the slice is reused by the following call.
func (m *benchEvents) next(n int) []pgevents.Event {
	hosts := benchHostNames()
	m.buf = m.buf[:0]
	for range n {
		m.seq++
		p := make([]byte, 0, 40)
		p = append(p, `{"producer":`...)
		p = strconv.AppendInt(p, int64(m.id), 10)
		p = append(p, `,"seq":`...)
		p = strconv.AppendInt(p, m.seq, 10)
		p = append(p, '}')
		m.buf = append(m.buf, pgevents.Event{
			TopicID: benchTopic, HostID: hosts[m.rng.IntN(len(hosts))],
			UserID: benchUserNames[m.rng.IntN(len(benchUserNames))], EventType: "bench.event", Payload: p,
		})
	}
	return m.buf
}

// benchAppendFunc appends evs in tx: pgevents.Append, or the plain-SQL
// baseline of the append case.
type benchAppendFunc func(ctx context.Context, tx pgx.Tx, evs []pgevents.Event) error

// benchAppendPgevents appends with pgevents.Append, one round trip.
func benchAppendPgevents(ctx context.Context, tx pgx.Tx, evs []pgevents.Event) error {
	_, err := pgevents.Append(ctx, tx, evs...)
	return err
}

// benchRate is an offered rate in events/s that may change while producers
// run; zero (or a nil *benchRate) means as fast as they can.
type benchRate struct{ bits atomic.Uint64 }

// newBenchRate returns a rate of v events/s.
func newBenchRate(v float64) *benchRate {
	r := &benchRate{}
	r.set(v)
	return r
}

// set changes the rate.
func (r *benchRate) set(v float64) { r.bits.Store(math.Float64bits(v)) }

// get returns the rate, 0 for a nil rate.
func (r *benchRate) get() float64 {
	if r == nil {
		return 0
	}
	return math.Float64frombits(r.bits.Load())
}

// benchPacer spaces one producer's transactions so that it offers its share
// of a rate. A producer that falls behind catches up by at most a second's
// worth, so that a stall does not turn into an unbounded burst.
type benchPacer struct {
	next time.Time
	// due is when the transaction that wait let go was scheduled to start
	// (zero when unpaced).
	due time.Time
}

// wait sleeps until n more events may be sent at rate events/s (0: at
// once). It returns false, without sleeping further, when that would be
// after stop or ctx ends first.
func (p *benchPacer) wait(ctx context.Context, stop time.Time, rate float64, n int) bool {
	if rate <= 0 {
		p.next, p.due = time.Time{}, time.Time{}
		return true
	}
	interval := time.Duration(float64(n) / rate * float64(time.Second))
	now := time.Now()
	if p.next.IsZero() {
		// Stagger the producers over the first interval.
		p.next = now.Add(rand.N(interval + 1))
	}
	if earliest := now.Add(-time.Second); p.next.Before(earliest) {
		p.next = earliest
	}
	if d := p.next.Sub(now); d > 0 {
		if p.next.After(stop) {
			return false
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
	p.due = p.next
	p.next = p.next.Add(interval)
	return true
}

// benchLoad describes the traffic of a set of producers: each appends
// transactions of txSize events, together offering rate.
type benchLoad struct {
	producers int
	txSize    int
	rate      *benchRate        // nil: as fast as they can
	appendFn  benchAppendFunc   // nil: pgevents.Append
	limit     int64             // stop after this many events in total; 0: no limit
	txTimes   *latency.Recorder // when set, receives each transaction's duration, BEGIN to COMMIT
	txFn      benchTxFunc       // runs a whole transaction instead of BEGIN, appendFn, COMMIT
	oneHost   bool              // all events of a transaction for one random host
	// onCommit, when set, is called with the events of each transaction
	// right after its COMMIT returned (from the producer's goroutine), with
	// the transaction's times.
	onCommit func(evs []pgevents.Event, t benchTxTimes)
}

// benchTxTimes are the times of one producer transaction.
type benchTxTimes struct {
	due   time.Time // when the pacer scheduled it (zero when unpaced)
	began time.Time // the producer's call: before BEGIN (or AppendCommit's BEGIN)
	done  time.Time // its COMMIT returned
}

// benchTxFunc runs one whole producer transaction of evs on pool: the
// producers case's appends, which pipeline the COMMIT.
type benchTxFunc func(ctx context.Context, pool *pgxpool.Pool, evs []pgevents.Event) error

// benchLoadResult is what a run of producers achieved.
type benchLoadResult struct {
	events int64         // events committed
	took   time.Duration // from start until the last producer finished
	// steadyEvents were committed between a fifth of the run's duration
	// and its end, a span of steadyDur: the run without its ramp-up and
	// without the tail of transactions still under way when time was up.
	steadyEvents int64
	steadyDur    time.Duration
}

// rate returns the events committed per second of the whole run.
func (r benchLoadResult) rate() float64 { return float64(r.events) / r.took.Seconds() }

// run runs the producers on pool until d has passed, limit events have been
// appended, or ctx ends. appended, when not nil, counts events as their
// transactions commit, for observers. A transaction under way when d passes
// completes.
func (l benchLoad) run(ctx context.Context, pool *pgxpool.Pool, d time.Duration, appended *atomic.Int64) (benchLoadResult, error) {
	if appended == nil {
		appended = new(atomic.Int64)
	}
	fn := l.appendFn
	if fn == nil {
		fn = benchAppendPgevents
	}
	base := appended.Load()
	began := time.Now()
	stop := began.Add(d)
	steadyFrom := began.Add(d / 5)
	var claimed, steady atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for i := range l.producers {
		g.Go(func() error {
			m := newBenchEvents(i)
			var p benchPacer
			for time.Now().Before(stop) {
				if l.limit > 0 && claimed.Add(int64(l.txSize)) > l.limit {
					return nil
				}
				if !p.wait(gctx, stop, l.rate.get()/float64(l.producers), l.txSize) {
					return nil
				}
				evs := m.next(l.txSize)
				if l.oneHost {
					evs = m.oneHost(evs)
				}
				t := time.Now()
				var err error
				if l.txFn != nil {
					err = l.txFn(gctx, pool, evs)
				} else {
					err = pgx.BeginFunc(gctx, pool, func(tx pgx.Tx) error { return fn(gctx, tx, evs) })
				}
				done := time.Now()
				if l.txTimes != nil {
					l.txTimes.Add(done.Sub(t))
				}
				if err == nil && l.onCommit != nil {
					l.onCommit(evs, benchTxTimes{due: p.due, began: t, done: done})
				}
				if err != nil {
					if gctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("producer %d: %w", i, err)
				}
				appended.Add(int64(len(evs)))
				if now := time.Now(); !now.Before(steadyFrom) && now.Before(stop) {
					steady.Add(int64(len(evs)))
				}
			}
			return nil
		})
	}
	err := g.Wait()
	if err == nil {
		err = ctx.Err()
	}
	return benchLoadResult{events: appended.Load() - base, took: time.Since(began),
		steadyEvents: steady.Load(), steadyDur: stop.Sub(steadyFrom)}, err
}

// benchConsumer is an in-process consumer of the bench topic.
type benchConsumer struct {
	*pgevents.Consumer
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned; err is set then
	err    error
}

// benchNoopHandlers returns handlers that accept every event and do nothing.
func benchNoopHandlers() *pgevents.Handlers {
	hs := &pgevents.Handlers{}
	hs.HandleAll(pgevents.HandlerFunc(func(context.Context, pgx.Tx, *pgevents.Event) error { return nil }))
	return hs
}

// startBenchConsumer runs a consumer of the bench topic with cfg (no-op
// handlers unless cfg says otherwise) until stop, and returns once its
// listener is connected.
func startBenchConsumer(ctx context.Context, pool *pgxpool.Pool, cfg pgevents.Config) (*benchConsumer, error) {
	if cfg.TopicID == 0 {
		cfg.TopicID = benchTopic
	}
	if cfg.Handlers == nil {
		cfg.Handlers = benchNoopHandlers()
	}
	c, err := pgevents.NewConsumer(pool, cfg)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	bc := &benchConsumer{Consumer: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		bc.err = c.Run(cctx)
		close(bc.done)
	}()
	err = benchWait(ctx, 15*time.Second, "consumer listener connected", func() (bool, error) {
		select {
		case <-bc.done:
			return false, fmt.Errorf("consumer stopped: %v", bc.err)
		default:
			return c.Ready(), nil
		}
	})
	if err != nil {
		_ = bc.stop()
		return nil, err
	}
	return bc, nil
}

// stop cancels the consumer and waits, at most 30 s, for Run to return.
func (bc *benchConsumer) stop() error {
	bc.cancel()
	select {
	case <-bc.done:
		return bc.err
	case <-time.After(30 * time.Second):
		return errors.New("consumer did not stop within 30 s")
	}
}

// waitHandled waits until the consumer has handled n events.
func (bc *benchConsumer) waitHandled(ctx context.Context, n int64, timeout time.Duration) error {
	return benchWait(ctx, timeout, fmt.Sprintf("%d events handled", n), func() (bool, error) {
		select {
		case <-bc.done:
			return false, fmt.Errorf("consumer stopped: %v", bc.err)
		default:
			return bc.Stats().Handled >= n, nil
		}
	})
}

// benchWaits samples the active sessions of a database in pg_stat_activity
// and counts their wait events by application_name, or by role when byRole
// is set ("CPU" when a session is active and waits for nothing): evidence
// of what bounds a rate. A session that waits in pg_advisory_lock, a
// candidate for a role (the watcher's or the sequencer's key: it waits as
// long as another process holds the role), is not counted: it does no
// work and holds nothing up.
type benchWaits struct {
	byRole  bool
	mu      sync.Mutex
	ticks   int
	samples map[string]map[string]int // application_name (or role) -> wait -> samples
}

// run samples every interval until ctx ends.
func (w *benchWaits) run(ctx context.Context, pool *pgxpool.Pool, every time.Duration) {
	benchSampleWaits(ctx, pool, every, func() *benchWaits { return w })
}

// benchWatch samples the active sessions of db every interval, in the
// background, until stop is called (stop may be called more than once).
func benchWatch(ctx context.Context, db *benchDB, every time.Duration) (w *benchWaits, stop func()) {
	w = &benchWaits{}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		w.run(ctx, db.pool, every)
		close(done)
	}()
	var once sync.Once
	return w, func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}

// benchSampleWaits samples the active sessions of the pool's database
// every interval until ctx ends, into the benchWaits that to returns at
// that time (none when nil).
func benchSampleWaits(ctx context.Context, pool *pgxpool.Pool, every time.Duration, to func() *benchWaits) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w := to()
		if w == nil {
			continue
		}
		rows, err := pool.Query(ctx, `SELECT CASE WHEN $1 THEN usename::text ELSE application_name END,
       coalesce(wait_event_type || ':' || wait_event, 'CPU')
FROM pg_stat_activity
WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
  AND NOT (wait_event_type = 'Lock' AND query LIKE '%pg_advisory_lock(%')`, w.byRole)
		if err != nil {
			continue
		}
		w.mu.Lock()
		if w.samples == nil {
			w.samples = map[string]map[string]int{}
		}
		w.ticks++
		for rows.Next() {
			var app, wait string
			if rows.Scan(&app, &wait) == nil {
				if w.samples[app] == nil {
					w.samples[app] = map[string]int{}
				}
				w.samples[app][wait]++
			}
		}
		w.mu.Unlock()
		rows.Close()
	}
}

// summary describes what the sessions of app (a role, with byRole) were
// doing: the average number active and the share of their samples per
// wait event, largest first.
func (w *benchWaits) summary(app string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.samples[app]
	total := 0
	type kv struct {
		k string
		v int
	}
	var kvs []kv
	for k, v := range m {
		total += v
		kvs = append(kvs, kv{k, v})
	}
	if total == 0 || w.ticks == 0 {
		return app + ": never active"
	}
	slices.SortFunc(kvs, func(a, b kv) int { return b.v - a.v })
	parts := make([]string, 0, 4)
	for _, e := range kvs[:min(4, len(kvs))] {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", e.k, 100*float64(e.v)/float64(total)))
	}
	return fmt.Sprintf("%s: %.1f active on average (%s)", app, float64(total)/float64(w.ticks), strings.Join(parts, ", "))
}
