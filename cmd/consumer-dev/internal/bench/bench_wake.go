package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
)

// benchWakeCounter is a consumer's Observer that counts the wake-ups, by
// source.
type benchWakeCounter struct {
	notified atomic.Int64
	sources  [8]atomic.Int64
}

// benchWakes is a reading of a benchWakeCounter: wake-ups by source.
type benchWakes [8]int64

// read returns the counts so far.
func (o *benchWakeCounter) read() benchWakes {
	var w benchWakes
	for s := range o.sources {
		w[s] = o.sources[s].Load()
	}
	return w
}

// since returns the wake-ups from start to w.
func (w benchWakes) since(start benchWakes) benchWakes {
	for s := range w {
		w[s] -= start[s]
	}
	return w
}

// add returns w plus x.
func (w benchWakes) add(x benchWakes) benchWakes {
	for s := range w {
		w[s] += x[s]
	}
	return w
}

// summary says how many wake-ups came from each source, and per committed
// transaction when txs > 0.
func (w benchWakes) summary(txs int64) string {
	var parts []string
	for s := range w {
		if n := w[s]; n > 0 {
			if txs > 0 {
				parts = append(parts, fmt.Sprintf("%s %d (%.3f/tx)", pgevents.WakeSource(s), n, float64(n)/float64(txs)))
			} else {
				parts = append(parts, fmt.Sprintf("%s %d", pgevents.WakeSource(s), n))
			}
		}
	}
	if len(parts) == 0 {
		return "no wake-ups"
	}
	return "wake-ups: " + strings.Join(parts, ", ")
}

func (o *benchWakeCounter) BatchCommitted(pgevents.BatchStats) {}
func (o *benchWakeCounter) BatchFailed(int, pgevents.Class)    {}
func (o *benchWakeCounter) ListenerConnected(bool)             {}
func (o *benchWakeCounter) Skipped(int, int64, string)         {}
func (o *benchWakeCounter) Woken(_ int, src pgevents.WakeSource) {
	if src == pgevents.WakeNotify {
		o.notified.Add(1)
	}
	if int(src) < len(o.sources) {
		o.sources[src].Add(1)
	}
}

// benchSyncChannel is the channel benchNotifies.sync notifies: nobody but
// the bench listens there.
const benchSyncChannel = "pgevents_bench_sync"

// benchNotifies counts the notifications the producers send, by topic: a
// connection of its own LISTENs on the channels of the database's topics
// (log_counter.channel) and attributes each notification to the topic its
// payload starts with ("<topic>:..."). It counts what producers send (what
// costs them the notification lock at commit), whether or not a consumer
// was woken by it.
type benchNotifies struct {
	conn   *pgx.Conn
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	byTopic map[int]int64
	other   int64

	synced atomic.Int64 // the highest sync payload received
	sent   int64        // the highest sync payload sent
}

// listenNotifies connects to db and listens on its topics' channels (read
// now: topics created later, on a channel of their own, are not counted)
// and on benchSyncChannel.
func listenNotifies(ctx context.Context, db *benchDB) (*benchNotifies, error) {
	rows, err := db.pool.Query(ctx, `SELECT DISTINCT channel FROM log_counter`)
	if err != nil {
		return nil, err
	}
	channels, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	cc, err := pgx.ParseConfig(db.url)
	if err != nil {
		return nil, err
	}
	cc.RuntimeParams["application_name"] = "bench-listener"
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, err
	}
	for _, ch := range append(channels, benchSyncChannel) {
		if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{ch}.Sanitize()); err != nil {
			_ = conn.Close(ctx)
			return nil, err
		}
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n := &benchNotifies{conn: conn, cancel: cancel, done: make(chan struct{}), byTopic: map[int]int64{}}
	go n.run(lctx)
	return n, nil
}

// run receives notifications until ctx is cancelled or the connection fails.
func (n *benchNotifies) run(ctx context.Context) {
	defer close(n.done)
	for {
		m, err := n.conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		if m.Channel == benchSyncChannel {
			if v, err := strconv.ParseInt(m.Payload, 10, 64); err == nil {
				n.synced.Store(v)
			}
			continue
		}
		head, _, _ := strings.Cut(m.Payload, ":")
		n.mu.Lock()
		if t, err := strconv.Atoi(head); err == nil {
			n.byTopic[t]++
		} else {
			n.other++
		}
		n.mu.Unlock()
	}
}

// sync returns once every notification committed before it was called has
// been received: it notifies benchSyncChannel and waits for its own
// notification (a session receives notifications in commit order, whatever
// their channel). It is not safe for concurrent use.
func (n *benchNotifies) sync(ctx context.Context, db *benchDB) error {
	return n.syncThen(ctx, db, nil)
}

// syncThen is sync, calling committed (when not nil) as soon as the
// bench's own notification has committed: a notification committed after
// that is received after sync returns.
func (n *benchNotifies) syncThen(ctx context.Context, db *benchDB, committed func()) error {
	n.sent++
	want := n.sent
	if _, err := db.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, benchSyncChannel, strconv.FormatInt(want, 10)); err != nil {
		return err
	}
	if committed != nil {
		committed()
	}
	return benchWait(ctx, 10*time.Second, "the bench's LISTEN connection to catch up", func() (bool, error) {
		select {
		case <-n.done:
			return false, fmt.Errorf("the bench's LISTEN connection failed")
		default:
		}
		return n.synced.Load() >= want, nil
	})
}

// count returns the notifications received for topic so far.
func (n *benchNotifies) count(topic int) int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.byTopic[topic]
}

// close stops listening.
func (n *benchNotifies) close() {
	n.cancel()
	<-n.done
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = n.conn.Close(ctx)
}

// benchTracer counts, on a consumer's pool, the transactions its statements
// end (a statement, batch or prepare after which the session is idle, not
// in a transaction block), and the pings pgxpool sends before handing out a
// connection that was idle for over a second (a transaction on the server
// too), by the consumer's task that ran them, found in the caller's stack:
// the lease heartbeat, the listener's canary, the subscription heartbeat,
// maintenance, the poll, the watcher, a worker. The server's count
// (pg_stat_database) says how many there were; this says whose they were.
type benchTracer struct {
	mu     sync.Mutex
	counts map[string]int64
}

// benchTracerKey carries a statement's task from its start to its end.
type benchTracerKey struct{}

// benchTasks maps a function of the caller's stack (a substring of its
// full name) to the task it belongs to, innermost first.
var benchTasks = []struct{ fn, task string }{
	{"internal/lease.(*Leaser)", "lease heartbeat"},
	{"pgevents/listener.(*Listener).watch", "listener canary"},
	{"pgevents/listener.", "listener"},
	{"pgevents.(*Consumer).subscription", "subscription heartbeat"},
	{"pgevents.(*Consumer).reportSkips", "subscription heartbeat"},
	{"pgevents.Maintain", "maintenance"},
	{"pgevents.(*Consumer).maintain", "maintenance"},
	{"pgevents.(*Consumer).poll", "poll"},
	{"pgevents.(*watcher)", "watcher"},
	{"pgevents.(*worker)", "worker"},
}

// benchAllowedTasks are the tasks an idle consumer is expected to run.
var benchAllowedTasks = []string{"lease heartbeat", "listener canary", "subscription heartbeat", "maintenance", "poll"}

// task returns the task of the calling goroutine's stack.
func (t *benchTracer) task() string {
	pcs := make([]uintptr, 64)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	first := ""
	for {
		f, more := frames.Next()
		if first == "" && strings.Contains(f.Function, "pgevents/pgevents") && !strings.Contains(f.Function, "cmd/consumer-dev/internal/bench") {
			first = f.Function
		}
		for _, k := range benchTasks {
			if strings.Contains(f.Function, k.fn) {
				return k.task
			}
		}
		if !more {
			break
		}
	}
	if first == "" {
		return "other"
	}
	return "other: " + first[strings.LastIndex(first, "/")+1:]
}

// add counts a transaction of task.
func (t *benchTracer) add(task string) {
	t.mu.Lock()
	if t.counts == nil {
		t.counts = map[string]int64{}
	}
	t.counts[task]++
	t.mu.Unlock()
}

// ended counts a transaction of the task in ctx if conn's session is no
// longer in a transaction block.
func (t *benchTracer) ended(ctx context.Context, conn *pgx.Conn) {
	if conn.PgConn().TxStatus() != 'I' {
		return
	}
	task, _ := ctx.Value(benchTracerKey{}).(string)
	t.add(task)
}

func (t *benchTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, benchTracerKey{}, t.task())
}

func (t *benchTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryEndData) {
	t.ended(ctx, conn)
}

func (t *benchTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, benchTracerKey{}, t.task())
}

func (t *benchTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t *benchTracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchEndData) {
	t.ended(ctx, conn)
}

func (t *benchTracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return context.WithValue(ctx, benchTracerKey{}, t.task())
}

func (t *benchTracer) TracePrepareEnd(ctx context.Context, conn *pgx.Conn, d pgx.TracePrepareEndData) {
	if !d.AlreadyPrepared {
		t.ended(ctx, conn)
	}
}

// shouldPing is pgxpool's default ShouldPing (a connection idle for over a
// second is pinged), counting the pings.
func (t *benchTracer) shouldPing(_ context.Context, p pgxpool.ShouldPingParams) bool {
	if p.IdleDuration > time.Second {
		t.add(t.task() + " (pgxpool ping)")
		return true
	}
	return false
}

// install makes pc's connections traced by t.
func (t *benchTracer) install(pc *pgxpool.Config) {
	pc.ConnConfig.Tracer = t
	pc.ShouldPing = t.shouldPing
}

// read returns the counts so far.
func (t *benchTracer) read() benchTaskCounts {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(benchTaskCounts, len(t.counts))
	for k, v := range t.counts {
		out[k] = v
	}
	return out
}

// benchTaskCounts are transactions by task.
type benchTaskCounts map[string]int64

// since returns the counts from start to c.
func (c benchTaskCounts) since(start benchTaskCounts) benchTaskCounts {
	out := benchTaskCounts{}
	for k, v := range c {
		if d := v - start[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// allowed reports whether task (or its pings) is one an idle consumer is
// expected to run.
func benchAllowedTask(task string) bool {
	task = strings.TrimSuffix(task, " (pgxpool ping)")
	return slices.Contains(benchAllowedTasks, task)
}

// split returns the transactions of the allowed tasks and of the others.
func (c benchTaskCounts) split() (allowed, other int64) {
	for k, v := range c {
		if benchAllowedTask(k) {
			allowed += v
		} else {
			other += v
		}
	}
	return allowed, other
}

// summary lists the counts per second over d, largest first.
func (c benchTaskCounts) summary(d time.Duration) string {
	type kv struct {
		k string
		v int64
	}
	var kvs []kv
	for k, v := range c {
		kvs = append(kvs, kv{k, v})
	}
	slices.SortFunc(kvs, func(a, b kv) int {
		if a.v != b.v {
			return int(b.v - a.v)
		}
		return strings.Compare(a.k, b.k)
	})
	parts := make([]string, 0, len(kvs))
	for _, e := range kvs {
		parts = append(parts, fmt.Sprintf("%s %d (%.2f/s)", e.k, e.v, float64(e.v)/d.Seconds()))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
