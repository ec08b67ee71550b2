package kafka

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents/listener"
	"github.com/pgevents/pgevents/schema"
)

// How a waiting Fetch learns of new events.
//
// pgevents' own wake-ups reach the endpoint as they reach a consumer that
// does not hold the topic's watch key: the endpoint LISTENs on each
// topic's channel (package listener), and holds each topic's follow key
// for its session, so that the elected watcher of a topic (the one
// consumer process per topic and database that reads the tails while
// events flow) announces every partition that moved, and producers notify
// the partitions it sleeps on. A sequenced topic's ticks notify every
// partition they move, whoever watches (migration 0023). A notification
// wakes the fetches waiting on its partitions at once.
//
// When no consumer of the topic runs (nobody holds its watch key: looked
// at every electedCheck), nobody announces anything, and the endpoint
// reads the tails of the partitions its fetches wait on itself while some
// fetch waits (one statement for every waiting fetch of the gateway, one
// index lookup per partition): every lookAlone while events flow, and,
// once no partition moved for lookQuiet, twice as late each time up to
// lookAloneMax (an idle endpoint runs 40 statements a second, not 1,000;
// the first event after a quiet spell waits up to lookAloneMax). A fetch
// that starts looks at once. While a watcher is elected, it reads them
// every lookFollowing (up to lookFollowingMax when quiet) only: the safety
// net for a notification lost, or late on a busy machine (the bench's
// kafka case measured a p99 of 100 ms with a 100 ms net at 1,000 events/s
// and a pgevents consumer attached on 2 cores).
const (
	lookAlone        = time.Millisecond
	lookAloneMax     = 25 * time.Millisecond
	lookFollowing    = 10 * time.Millisecond
	lookFollowingMax = 100 * time.Millisecond
	lookQuiet        = time.Second
	electedCheck     = time.Second
)

const (
	// tailsSQL reads the tail (the highest offset committed, 0 for none)
	// of each (topic $1[i], partition $2[i]), from the end of
	// partition_tails' index.
	tailsSQL = `SELECT coalesce((SELECT t.c_offset FROM {schema}partition_tails t
                  WHERE t.topic_id = u.t AND t.partition_id = u.p ORDER BY t.c_offset DESC LIMIT 1), 0)
FROM unnest($1::integer[], $2::integer[]) WITH ORDINALITY AS u(t, p, i)
ORDER BY u.i`

	// electedSQL says, for each topic in $1, whether a session holds its
	// watch key (an elected watcher; see internal/store's wake.go).
	electedSQL = `SELECT u.t, EXISTS (SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid)
FROM unnest($1::integer[]) AS u(t)
CROSS JOIN LATERAL (SELECT {schema}lock_key('watch', u.t::text) AS key) k`

	// followSQL takes each topic's follow key in $1, shared, for the
	// session: while a session holds it, the elected watcher announces
	// what moved (internal/store's announceSQL).
	followSQL = `SELECT count(pg_advisory_lock_shared({schema}lock_key('follow', t::text))) FROM unnest($1::integer[]) AS t`
)

// watchPoint is a partition a fetch waits on, caught up at hw.
type watchPoint struct {
	topic     int
	partition int32
	hw        int64
}

type waiter struct {
	points []watchPoint
	woken  chan struct{} // closed once
}

// waiters wakes the fetches waiting for events.
type waiters struct {
	s    *Server
	mu   sync.Mutex
	set  map[*waiter]bool
	poke chan struct{}
	// elected, per topic id: a watcher announces its partitions.
	elected map[int]bool
	// moved is when a wake-up last woke a fetch.
	moved time.Time
}

func newWaiters(s *Server) *waiters {
	return &waiters{s: s, set: map[*waiter]bool{}, poke: make(chan struct{}, 1), elected: map[int]bool{}}
}

// wait waits until an event may have been appended beyond a point's high
// watermark, or deadline, or ctx's end; it reports whether it was woken.
func (w *waiters) wait(ctx context.Context, points []watchPoint, deadline time.Time) bool {
	wt := &waiter{points: points, woken: make(chan struct{})}
	w.mu.Lock()
	w.set[wt] = true
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.set, wt)
		w.mu.Unlock()
	}()
	select {
	case w.poke <- struct{}{}:
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-wt.woken:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// wake wakes the waiters of topic's partition (every partition when it is
// -1) whose high watermark is at most tail (any, when tail is 0).
func (w *waiters) wake(topic int, partition int32, tail int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for wt := range w.set {
		for _, pt := range wt.points {
			if pt.topic == topic && (partition < 0 || pt.partition == partition) && (tail == 0 || tail >= pt.hw) {
				close(wt.woken)
				delete(w.set, wt)
				w.moved = time.Now()
				break
			}
		}
	}
}

// sink turns a listener's notifications into wake-ups.
type sink struct{ w *waiters }

func (k sink) Notify(topic, partition int, maxOffset int64) {
	k.w.wake(topic, int32(partition), maxOffset)
}

func (k sink) Connected() {
	// Whatever committed while nobody listened: look at the tails now.
	select {
	case k.w.poke <- struct{}{}:
	default:
	}
}

// run listens, follows, and looks at the tails while fetches wait.
func (w *waiters) run(ctx context.Context) error {
	s := w.s
	ids := make([]int, 0, len(s.ids))
	for id := range s.ids {
		ids = append(ids, id)
	}
	channels := map[string]bool{}
	for _, id := range ids {
		_, ch, err := schema.TopicWake(ctx, s.pool, id)
		if err != nil {
			s.log.Warn().Err(err).Int("topic", id).Msg("kafka: the topic's channel is unknown; its fetches are woken by looking at its tails")
			continue
		}
		channels[ch] = true
	}
	g, gctx := errgroup.WithContext(ctx)
	for ch := range channels {
		ln, err := listener.New(listener.Config{
			ConnConfig: s.pool.Config().ConnConfig,
			Channel:    ch,
			// The canary pings the listening session: a notification
			// would wake every listener of the database.
			Logger: &s.log,
			Sink:   sink{w},
		})
		if err != nil {
			return err
		}
		g.Go(func() error { return ln.Run(gctx) })
	}
	g.Go(func() error { w.follow(gctx, ids); return nil })
	g.Go(func() error { w.look(gctx); return nil })
	return g.Wait()
}

// follow holds the topics' follow keys on a session of its own, taken
// again after the session is lost.
func (w *waiters) follow(ctx context.Context, ids []int) {
	for ctx.Err() == nil {
		func() {
			conn, err := w.s.pool.Acquire(ctx)
			if err != nil {
				return
			}
			defer func() {
				// The session holds the keys: closed, never given back.
				_ = conn.Conn().Close(context.WithoutCancel(ctx))
				conn.Release()
			}()
			if _, err := conn.Exec(ctx, schema.SQL(ctx, followSQL), ids); err != nil {
				return
			}
			w.checkElected(ctx, conn, ids)
			t := time.NewTicker(electedCheck)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if !w.checkElected(ctx, conn, ids) {
						return
					}
				}
			}
		}()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (w *waiters) checkElected(ctx context.Context, conn *pgxpool.Conn, ids []int) bool {
	rows, err := conn.Query(ctx, schema.SQL(ctx, electedSQL), ids)
	if err != nil {
		return false
	}
	got := map[int]bool{}
	var (
		t int
		e bool
	)
	if _, err := pgx.ForEachRow(rows, []any{&t, &e}, func() error { got[t] = e; return nil }); err != nil {
		return false
	}
	w.mu.Lock()
	w.elected = got
	w.mu.Unlock()
	return true
}

// look reads the tails of the partitions fetches wait on, every lookAlone
// when one of their topics has no elected watcher, else every
// lookFollowing, and wakes the fetches whose partitions moved.
func (w *waiters) look(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	interval := lookAlone
	for {
		w.mu.Lock()
		var (
			ts, ps []int32
			alone  bool
		)
		quiet := time.Since(w.moved) > lookQuiet
		seen := map[watchPoint]bool{}
		for wt := range w.set {
			for _, pt := range wt.points {
				k := watchPoint{topic: pt.topic, partition: pt.partition}
				if !seen[k] {
					seen[k] = true
					ts, ps = append(ts, int32(pt.topic)), append(ps, pt.partition)
					alone = alone || !w.elected[pt.topic]
				}
			}
		}
		w.mu.Unlock()
		if len(ts) > 0 {
			rows, err := w.s.pool.Query(ctx, schema.SQL(ctx, tailsSQL), ts, ps)
			if err == nil {
				i := 0
				var tail int64
				_, _ = pgx.ForEachRow(rows, []any{&tail}, func() error {
					if tail > 0 {
						w.wake(int(ts[i]), ps[i], tail)
					}
					i++
					return nil
				})
			}
		}
		next := time.Hour
		switch {
		case len(ts) == 0:
		case alone && quiet:
			interval = min(2*interval, lookAloneMax)
			next = interval
		case alone:
			interval = lookAlone
			next = interval
		case quiet:
			interval = min(max(2*interval, lookFollowing), lookFollowingMax)
			next = interval
		default:
			interval = lookFollowing
			next = interval
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-w.poke:
			t.Stop() // Go 1.23's timers: Reset after Stop sends no stale tick
		case <-t.C:
		}
	}
}
