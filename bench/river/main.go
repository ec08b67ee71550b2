// Command river is River, the job queue (github.com/riverqueue/river with
// its pgx driver riverpgxv5), doing what pgevents' bench measures pgevents
// doing, so that `consumer-dev bench --only peers` can put the two side by
// side, on the same server, in the same run. It lives in a Go module of its
// own so that pgevents' go.mod does not depend on River: the bench builds
// it with `go build` and runs it as a subprocess, whose CPU the machine's
// /proc/stat counts as it counts the bench's in-process consumers.
//
// One run makes one measurement on the database DATABASE_URL (or -database-url)
// names, after migrating River's tables there (rivermigrate, up):
//
//   - -mode latency: paced producers (-producers of them, together offering
//     -rate transactions a second for -duration, after a -warmup at the same
//     rate) insert jobs, each transaction on its own: BEGIN, Client.InsertTx,
//     COMMIT, as a service that writes to an outbox does. A River client in
//     this process works them from one queue with a worker that notes the
//     time it is called. Reported: commit → handler start (from the
//     producer's COMMIT returned, and from its call before BEGIN), and the
//     producer's transaction, BEGIN → COMMIT returned, as p50, p99 and
//     p99.9, on this process's monotonic clock; the job's arguments carry
//     its producer and sequence number, which pair the two.
//   - -mode schedule: the same producers and client; reported: how many of
//     the offered transactions committed, and how many on schedule (within
//     one producer interval of the time the pacer gave them).
//   - -mode drain: -jobs jobs inserted beforehand (InsertManyFast, 1,000 a
//     call), the database vacuumed and analysed; then the client is started and
//     timed until every job is completed.
//
// The bench's paced producers work the same way: each producer waits for
// its share of the rate, its first transaction at a random point of the
// first interval, and catches up by at most a second when it falls behind.
//
// Output, on stdout, one JSON object a line:
//
//	{"type":"mark","mark":"start"}   the measured window begins now
//	{"type":"mark","mark":"end"}     it has ended: every job of the window completed
//	{"type":"result",...}            the figures (see result); then the program exits 0
//
// The bench reads /proc/stat (and this process's /proc/<pid>/stat) when
// it reads each mark, so the window's CPU is every process's: producers,
// River's client, the server. A job counts as completed when River's
// completer has written its state (the client's EventKindJobCompleted), as
// a pgevents event counts as handled once its batch committed. Progress and
// errors go to stderr; a failure exits 1, bad flags 2.
//
// River's settings, chosen for the lowest latency River offers: FetchCooldown
// and FetchPollInterval at River's minimum, 1 ms (defaults 100 ms and 1 s):
// the client fetches at most 1 ms after a job's insert notification, and
// polls every 1 ms without one. -max-workers (default 100) bounds the jobs
// worked at once, and so each fetch; the handler returns at once, so 100
// keeps up with 3,000 jobs/s with room to spare. The client's pool has
// -pool connections (default 8: the notifier's LISTEN connection, fetches,
// the completer and the leader's maintenance), the producers a pool of
// their own, -producers + 2. Everything else is River's default.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"golang.org/x/sync/errgroup"
)

// options are the command's flags.
type options struct {
	url               string
	mode              string
	rate              float64
	producers         int
	duration          time.Duration
	warmup            time.Duration
	txSize            int
	jobs              int
	maxWorkers        int
	poolSize          int
	fetchCooldown     time.Duration
	fetchPollInterval time.Duration
}

// errUsage marks errors in the command line, which exit with status 2.
var errUsage = errors.New("usage")

// parseOptions parses args (without the program name). -h prints the
// usage to stdout and returns flag.ErrHelp; a bad command line prints it to
// stderr and returns an error wrapping errUsage.
func parseOptions(args []string, stdout, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("river", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "usage: river -mode latency|schedule|drain [flags]\n\n"+
			"River measured as pgevents' bench measures pgevents (see the package doc). DATABASE_URL names the database.\n\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	fs.StringVar(&o.url, "database-url", os.Getenv("DATABASE_URL"), "the database (default $DATABASE_URL)")
	fs.StringVar(&o.mode, "mode", "", "latency, schedule or drain")
	fs.Float64Var(&o.rate, "rate", 1000, "transactions per second offered by the producers together (latency, schedule)")
	fs.IntVar(&o.producers, "producers", 4, "paced producers (latency, schedule)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "the measured window (latency, schedule)")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "producers at the same rate before the window, whose jobs complete before it starts")
	fs.IntVar(&o.txSize, "tx-size", 1, "jobs per producer transaction")
	fs.IntVar(&o.jobs, "jobs", 100_000, "jobs inserted before the client starts (drain)")
	fs.IntVar(&o.maxWorkers, "max-workers", 100, "River's MaxWorkers for the queue")
	fs.IntVar(&o.poolSize, "pool", 8, "connections of the River client's pool")
	fs.DurationVar(&o.fetchCooldown, "fetch-cooldown", river.FetchCooldownMin, "River's FetchCooldown")
	fs.DurationVar(&o.fetchPollInterval, "fetch-poll-interval", river.FetchPollIntervalMin, "River's FetchPollInterval")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return o, err
		}
		usage(stderr)
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	case o.mode != "latency" && o.mode != "schedule" && o.mode != "drain":
		return o, fmt.Errorf("%w: -mode must be latency, schedule or drain, not %q", errUsage, o.mode)
	case o.url == "":
		return o, fmt.Errorf("%w: no database: set DATABASE_URL or -database-url", errUsage)
	case o.rate <= 0 || o.producers < 1 || o.txSize < 1 || o.duration <= 0 || o.warmup < 0:
		return o, fmt.Errorf("%w: -rate, -producers, -tx-size and -duration must be positive", errUsage)
	case o.jobs < 1 || o.maxWorkers < 1 || o.poolSize < 2:
		return o, fmt.Errorf("%w: -jobs and -max-workers must be positive, -pool at least 2", errUsage)
	}
	return o, nil
}

func main() {
	o, err := parseOptions(os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintf(os.Stderr, "river: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "river: %v\n", err)
		stop()
		os.Exit(1)
	}
}

// peerArgs are a job's arguments: which producer inserted it, and its
// sequence number there, which pair its handler's time with its producer's.
type peerArgs struct {
	Producer int   `json:"producer"`
	Seq      int64 `json:"seq"`
}

// Kind is the job's kind.
func (peerArgs) Kind() string { return "peer" }

// peerWorker notes the time each job's handler starts, and does nothing
// else.
type peerWorker struct {
	river.WorkerDefaults[peerArgs]
	marks *marks
}

// Work notes the handler's start.
func (w *peerWorker) Work(_ context.Context, job *river.Job[peerArgs]) error {
	w.marks.handled(job.Args.key(), time.Now())
	return nil
}

// key identifies the job among the run's.
func (a peerArgs) key() int64 { return int64(a.Producer)<<32 | a.Seq }

// bench is one run: the client, its pools, and what it counts.
type bench struct {
	o         options
	out       *json.Encoder
	client    *river.Client[pgx.Tx]
	pool      *pgxpool.Pool // the client's
	producers *pgxpool.Pool
	marks     *marks
	inserted  atomic.Int64 // jobs committed by the producers (or the preload)
	completed atomic.Int64 // jobs whose completion River has written
}

// run makes the measurement o asks for, writing JSON lines to stdout.
func run(ctx context.Context, o options, stdout io.Writer) error {
	b := &bench{o: o, out: json.NewEncoder(stdout), marks: newMarks()}
	pc, err := pgxpool.ParseConfig(o.url)
	if err != nil {
		return fmt.Errorf("database url: %w", err)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "river"
	pc.MaxConns = int32(o.poolSize)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	b.pool = pool
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}

	workers := river.NewWorkers()
	river.AddWorker(workers, &peerWorker{marks: b.marks})
	b.client, err = river.NewClient(driver, &river.Config{
		FetchCooldown:     o.fetchCooldown,
		FetchPollInterval: o.fetchPollInterval,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: o.maxWorkers}},
		Workers:           workers,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	events, cancel := b.client.SubscribeConfig(&river.SubscribeConfig{Kinds: []river.EventKind{river.EventKindJobCompleted}, ChanSize: 1 << 20})
	defer cancel()
	go func() {
		for range events {
			b.completed.Add(1)
		}
	}()

	if o.mode == "drain" {
		return b.drain(ctx)
	}

	ppc, err := pgxpool.ParseConfig(o.url)
	if err != nil {
		return err
	}
	ppc.ConnConfig.RuntimeParams["application_name"] = "bench-producer"
	ppc.MaxConns = int32(o.producers + 2)
	if b.producers, err = pgxpool.NewWithConfig(ctx, ppc); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer b.producers.Close()
	if err := b.client.Start(ctx); err != nil {
		return fmt.Errorf("start the client: %w", err)
	}
	defer b.stopClient()
	if o.warmup > 0 {
		if _, err := b.produce(ctx, o.warmup, nil); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		if err := b.waitCompleted(ctx); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	b.marks.reset()
	sched := &schedule{interval: time.Duration(float64(o.txSize*o.producers) / o.rate * float64(time.Second))}
	txDur := &durations{}
	if err := b.mark("start"); err != nil {
		return err
	}
	began := time.Now()
	committed, err := b.produce(ctx, o.duration, func(t txTimes) {
		sched.add(t)
		txDur.add(t.done.Sub(t.began))
	})
	if err != nil {
		return err
	}
	if err := b.waitCompleted(ctx); err != nil {
		return err
	}
	took := time.Since(began)
	if err := b.mark("end"); err != nil {
		return err
	}
	b.stopClient()

	r := b.result(took)
	r.Committed = committed
	r.Offered = int64(o.rate * o.duration.Seconds())
	r.OnSchedule, r.LateP99Ms = sched.summary()
	r.CommitToHandlerMs = b.marks.percentiles(false, 0.5, 0.99, 0.999)
	r.CallToHandlerMs = b.marks.percentiles(true, 0.5, 0.99, 0.999)
	r.TxMs = txDur.percentiles(0.5, 0.99)
	r.Handled = int64(b.marks.handledCount())
	return b.out.Encode(r)
}

// drain inserts o.jobs jobs with no client running, then starts it and
// times it until every job is completed.
func (b *bench) drain(ctx context.Context) error {
	const chunk = 1000
	params := make([]river.InsertManyParams, 0, chunk)
	var seq int64
	for left := b.o.jobs; left > 0; left -= len(params) {
		params = params[:0]
		for range min(chunk, left) {
			seq++
			params = append(params, river.InsertManyParams{Args: peerArgs{Seq: seq}})
		}
		if _, err := b.client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("preload: %w", err)
		}
	}
	b.inserted.Store(seq)
	if _, err := b.pool.Exec(ctx, "VACUUM (ANALYZE)"); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	if err := b.mark("start"); err != nil {
		return err
	}
	began := time.Now()
	if err := b.client.Start(ctx); err != nil {
		return fmt.Errorf("start the client: %w", err)
	}
	defer b.stopClient()
	if err := b.waitCompleted(ctx); err != nil {
		return err
	}
	took := time.Since(began)
	if err := b.mark("end"); err != nil {
		return err
	}
	b.stopClient()
	r := b.result(took)
	r.Rate = float64(b.completed.Load()) / took.Seconds()
	r.Handled = int64(b.marks.handledCount())
	return b.out.Encode(r)
}

// stopClient stops the client, waiting at most 30 s for its jobs; a
// second call does nothing.
func (b *bench) stopClient() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = b.client.Stop(ctx)
}

// mark writes a mark line.
func (b *bench) mark(name string) error {
	return b.out.Encode(struct {
		Type string `json:"type"`
		Mark string `json:"mark"`
	}{"mark", name})
}

// result is the run's figures, the last line of its output. Percentiles
// are in milliseconds, [p50, p99, p99.9] for latencies and [p50, p99] for
// transactions; empty in drain mode.
type result struct {
	Type              string    `json:"type"` // "result"
	Mode              string    `json:"mode"`
	River             string    `json:"river"`   // River's version, from the build
	Seconds           float64   `json:"seconds"` // from the start mark to the end mark
	Jobs              int64     `json:"jobs"`    // jobs completed in the window (and the warm-up's before it)
	Handled           int64     `json:"handled"` // jobs of the window whose handler was called
	Offered           int64     `json:"offered,omitempty"`
	Committed         int64     `json:"committed,omitempty"`   // producer transactions committed in the window
	OnSchedule        int64     `json:"on_schedule,omitempty"` // of which within one producer interval of their time
	LateP99Ms         float64   `json:"late_p99_ms,omitempty"` // COMMIT returned minus the scheduled time, p99
	CommitToHandlerMs []float64 `json:"commit_to_handler_ms,omitempty"`
	CallToHandlerMs   []float64 `json:"call_to_handler_ms,omitempty"`
	TxMs              []float64 `json:"tx_ms,omitempty"`
	Rate              float64   `json:"rate,omitempty"` // drain: jobs completed per second
}

// result returns the figures every mode has.
func (b *bench) result(took time.Duration) result {
	version := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				version = d.Version
			}
		}
	}
	return result{Type: "result", Mode: b.o.mode, River: version, Seconds: took.Seconds(), Jobs: b.completed.Load()}
}

// waitCompleted waits, at most a minute, until River has completed every
// job inserted so far.
func (b *bench) waitCompleted(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for b.completed.Load() < b.inserted.Load() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d jobs inserted, %d completed after a minute", b.inserted.Load(), b.completed.Load())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// txTimes are the times of one producer transaction.
type txTimes struct {
	due   time.Time // when the pacer scheduled it
	began time.Time // the producer's call, before BEGIN
	done  time.Time // COMMIT returned
}

// produce runs the paced producers for d, each transaction BEGIN,
// InsertTx per job, COMMIT, and returns how many transactions committed.
// onCommit, when not nil, gets each committed transaction's times.
func (b *bench) produce(ctx context.Context, d time.Duration, onCommit func(txTimes)) (int64, error) {
	var committed atomic.Int64
	stop := time.Now().Add(d)
	g, gctx := errgroup.WithContext(ctx)
	for i := range b.o.producers {
		g.Go(func() error {
			var p pacer
			var seq int64
			for time.Now().Before(stop) {
				if !p.wait(gctx, stop, b.o.rate/float64(b.o.producers), b.o.txSize) {
					return nil
				}
				keys := make([]int64, b.o.txSize)
				t := txTimes{due: p.due, began: time.Now()}
				err := pgx.BeginFunc(gctx, b.producers, func(tx pgx.Tx) error {
					for j := range keys {
						seq++
						a := peerArgs{Producer: i, Seq: seq}
						keys[j] = a.key()
						if _, err := b.client.InsertTx(gctx, tx, a, nil); err != nil {
							return err
						}
					}
					return nil
				})
				t.done = time.Now()
				if err != nil {
					if gctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("producer %d: %w", i, err)
				}
				b.inserted.Add(int64(len(keys)))
				committed.Add(1)
				b.marks.committed(keys, t)
				if onCommit != nil {
					onCommit(t)
				}
			}
			return nil
		})
	}
	err := g.Wait()
	if err == nil {
		err = ctx.Err()
	}
	return committed.Load(), err
}

// pacer spaces one producer's transactions so that it offers its share of
// the rate, as the bench's pacer does: the first at a random point of the
// first interval, and catching up by at most a second's worth.
type pacer struct {
	next time.Time
	due  time.Time // when the transaction wait let go was scheduled
}

// wait sleeps until n more jobs may be sent at rate jobs/s; false when
// that would be after stop, or ctx ended.
func (p *pacer) wait(ctx context.Context, stop time.Time, rate float64, n int) bool {
	interval := time.Duration(float64(n) / rate * float64(time.Second))
	now := time.Now()
	if p.next.IsZero() {
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

// marks pairs each job's producer times with its handler's start.
type marks struct {
	mu   sync.Mutex
	done map[int64]txTimes
	seen map[int64]time.Time
}

func newMarks() *marks { return &marks{done: map[int64]txTimes{}, seen: map[int64]time.Time{}} }

// reset forgets every mark.
func (m *marks) reset() {
	m.mu.Lock()
	m.done, m.seen = map[int64]txTimes{}, map[int64]time.Time{}
	m.mu.Unlock()
}

// committed marks the jobs of a transaction with its times.
func (m *marks) committed(keys []int64, t txTimes) {
	m.mu.Lock()
	for _, k := range keys {
		m.done[k] = t
	}
	m.mu.Unlock()
}

// handled marks the handler's start for a job (the first, if it runs
// twice).
func (m *marks) handled(key int64, at time.Time) {
	m.mu.Lock()
	if _, dup := m.seen[key]; !dup {
		m.seen[key] = at
	}
	m.mu.Unlock()
}

// handledCount returns how many jobs were marked handled.
func (m *marks) handledCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.seen)
}

// percentiles returns the percentiles ps, in milliseconds, of the time
// from each job's COMMIT returned (or its producer's call, fromCall) to its
// handler's start, over the jobs marked both ways.
func (m *marks) percentiles(fromCall bool, ps ...float64) []float64 {
	var d durations
	m.mu.Lock()
	for k, t := range m.done {
		if h, ok := m.seen[k]; ok {
			if fromCall {
				d.add(h.Sub(t.began))
			} else {
				d.add(h.Sub(t.done))
			}
		}
	}
	m.mu.Unlock()
	return d.percentiles(ps...)
}

// durations collects durations from concurrent goroutines.
type durations struct {
	mu sync.Mutex
	d  []time.Duration
}

// add records x.
func (d *durations) add(x time.Duration) {
	d.mu.Lock()
	d.d = append(d.d, x)
	d.mu.Unlock()
}

// percentiles returns the percentiles ps in milliseconds, each the
// element at index ⌊p·n⌋ of the sorted durations (the bench's rule), or
// zeros when there is none.
func (d *durations) percentiles(ps ...float64) []float64 {
	d.mu.Lock()
	s := slices.Clone(d.d)
	d.mu.Unlock()
	out := make([]float64, len(ps))
	if len(s) == 0 {
		return out
	}
	slices.Sort(s)
	for i, p := range ps {
		out[i] = float64(s[min(len(s)-1, int(p*float64(len(s))))]) / float64(time.Millisecond)
	}
	return out
}

// schedule collects how late paced transactions committed.
type schedule struct {
	interval time.Duration // one producer's interval between transactions
	mu       sync.Mutex
	late     []time.Duration
}

// add records a committed transaction.
func (s *schedule) add(t txTimes) {
	s.mu.Lock()
	s.late = append(s.late, t.done.Sub(t.due))
	s.mu.Unlock()
}

// summary returns how many transactions committed within one interval of
// their scheduled time, and the p99 of their lateness in milliseconds, by
// the bench's rule.
func (s *schedule) summary() (onTime int64, p99 float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.late) == 0 {
		return 0, 0
	}
	l := slices.Clone(s.late)
	slices.Sort(l)
	for _, x := range l {
		if x <= s.interval {
			onTime++
		}
	}
	return onTime, float64(l[min(len(l)-1, int(0.99*float64(len(l))))]) / float64(time.Millisecond)
}
