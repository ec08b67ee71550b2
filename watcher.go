package pgevents

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/finetimer"
	"github.com/pgevents/pgevents/internal/store"
)

// The watcher's timing.
const (
	// watchMin and watchMax bound how often, while some partition of the
	// topic is awake, the watcher reads the topic's appends counter: a
	// round trip and a buffer read. Right after the counter moved it reads
	// it again after watchMin, and each read that finds it still doubles
	// the wait, up to watchMax: events close together are found within
	// watchMin of their append's start (and, in flight, at their commit),
	// while a partition awake between sparse events costs at most one read
	// per watchMax. A fixed short wait would cost the consumer and the
	// server CPU for every read that finds nothing; a longer watchMax
	// would add its length to the latency of sparse events. The waits are
	// kept with a finetimer: Go's timers round each of them up to about a
	// millisecond. When the counter moved, or moved within settle, or
	// fullEvery has passed, the watcher also reads the awake partitions'
	// tails (one statement, one index lookup per partition; in the
	// counter's round trip when it moved lately), and looks for appends in
	// flight.
	watchMin  = 100 * time.Microsecond
	watchMax  = time.Millisecond
	settle    = 2 * time.Millisecond
	fullEvery = 10 * time.Millisecond
	// quietMin and quietMax bound how long a partition must have gone
	// without a new event before the watcher goes to sleep on it: quietGaps
	// of its mean gaps between events, so that a partition of steady
	// traffic stays awake (each sleep costs one notification, by the next
	// append, and a notifying commit serialises on the server). With events
	// at random (a Poisson stream), a gap longer than k means comes once in
	// e^k events: 8 makes it about one in 3,000, so that a steady stream
	// sends well under one notification per hundred transactions.
	quietGaps = 8
	quietMin  = 50 * time.Millisecond
	quietMax  = 2 * time.Second
	// keysCheck is how often a watcher asleep on every partition checks,
	// without a statement (a read of its socket that waits at most a
	// millisecond), that the session holding its sleep keys still exists.
	// A session ended by an administrator, a pooler or
	// idle_session_timeout drops the keys with it: appends then find
	// nobody asleep and notify nobody, and only this check (or the poll)
	// would wake the partitions.
	keysCheck = 100 * time.Millisecond
	// alwaysGrace is how long the watcher goes on watching after the
	// topic's wake-up mode became 'always' (every append notifies), and
	// then until it sees no append in flight: an append reads the mode at
	// its start, and one that started under 'waiting' notifies nobody
	// when no consumer sleeps on its partition, so the watcher must see
	// its commit. Such an append marks itself in flight without waiting
	// for anything after it read the mode, long before this runs out.
	alwaysGrace = 2 * time.Second
	// followCheck is how long a watcher waits for the watch key before it
	// looks whether the elected watcher is frozen, and ends its session
	// when it is (roles.go: its replica's heartbeat has lapsed and its
	// session has run no statement for roleGrace): a frozen elected
	// process is replaced within about followCheck plus roleGrace, where
	// the poll would take WaitPeriod.
	followCheck = roleCheck
)

// watcher finds the events committed in the topic's partitions, so that
// producers need not notify while events flow (a notifying commit takes a
// database-wide lock until its WAL flush, and notifying producers commit
// one at a time).
//
// # One watcher per topic and database
//
// Every consumer of a topic that is not sequenced runs a watcher (a
// sequenced topic's ticks announce every partition they move:
// Consumer.sequenced), but only one of them, in the whole database,
// watches: the one whose session holds the topic's watch
// key (store.Lead). The others wait for the key in the server, which costs
// them nothing, and the first of them takes over when the holder's session
// ends; every followCheck a waiting watcher looks whether the holder is
// frozen, and ends its session when it is (a frozen process keeps its
// sessions; roles.go). The elected watcher watches every partition of the
// topic, whoever consumes it, so that its cost is paid once per event,
// whatever the number of consumer processes (a deployment may run one per
// partition; a watcher in each, polling the topic's appends counter, would
// wake every process for every event of every partition). It tells the
// other consumers which partitions moved in one notification per look, of
// the form the producers' notifications have
// ("<topic>:<partition>/<tail>,..."), from its own session, whose commits
// do not wait for the WAL flush; a consumer's listener wakes only the
// workers of the partitions it runs. The notification is sent only while
// some watcher waits for the key (store.Lead): a lone consumer hints its
// workers directly. A notification stays a hint: a worker reads what its
// claim finds, and polls every WaitPeriod.
//
// # What it watches
//
// A partition is awake, and the watcher reads the topic's appends counter
// every watchMin to watchMax and the tails when it moved; or, once quiet,
// asleep, and the watcher holds its sleep key so that the next append
// notifies. The whole protocol, and why no event waits for the poll: see
// docs/concepts.md, "How a sleeping partition wakes".
//
// Without a connection, or after a failed statement, it waits (retry's
// backoff, up to backoff.DefaultMax) before the next attempt, waking
// earlier on a signal (the listener's reconnect says the database is back).
// A failure ends its session, and with it the watch key: another consumer
// may be elected meanwhile.
//
// An idle consumer runs no statement here: elected and asleep on every
// partition, or waiting for the key.
type watcher struct {
	c      *Consumer
	signal chan struct{} // something to do; never blocks the sender

	mu    sync.Mutex
	woken map[int]bool // partitions to wake
	all   bool         // wake every partition

	// Used by run's goroutine only.
	retry  *backoff.Retry
	wait   time.Duration // the backoff a failure of the last step asked for
	conn   *pgxpool.Conn // holds the watch key and the sleep keys; nil: none acquired
	asleep map[int]bool
	parts  map[int]*watched
	// The appends counter as last read, when it last moved, and when the
	// tails were last read; readTailsNext makes the next step read them
	// (a partition woke, or the watcher was elected).
	appends                     int64
	appendsMovedAt, tailsReadAt time.Time
	readTailsNext               bool
	// When the wake-up mode was last seen to become 'always' (zero: it is
	// 'waiting'), and whether the last tails read found an append in
	// flight: the watcher stops watching once alwaysGrace has passed and
	// none is.
	alwaysAt time.Time
	inFlight bool
}

// watched is what the watcher knows of one partition.
type watched struct {
	tail     int64         // the highest tail read
	activeAt time.Time     // when the tail last moved, an append was seen in flight, or the partition woke
	movedAt  time.Time     // when the tail last moved (zero: not since it was first seen or last slept)
	meanGap  time.Duration // mean gap between the tail's moves, smoothed
}

func newWatcher(c *Consumer) *watcher {
	return &watcher{c: c, signal: make(chan struct{}, 1), woken: map[int]bool{}, asleep: map[int]bool{}, parts: map[int]*watched{},
		retry: backoff.New(c.log, "watcher")}
}

// wake asks the watcher to wake partition p: to release its sleep key and
// read its tail again. It never blocks. It does nothing when the topic is
// sequenced: its consumer runs no watcher (Consumer.sequenced, set before
// any goroutine starts).
func (w *watcher) wake(p int) {
	if w.c.sequenced {
		return
	}
	w.mu.Lock()
	w.woken[p] = true
	w.mu.Unlock()
	w.poke()
}

// wakeAll is wake for every partition.
func (w *watcher) wakeAll() {
	if w.c.sequenced {
		return
	}
	w.mu.Lock()
	w.all = true
	w.mu.Unlock()
	w.poke()
}

// poke makes the watcher look at its partitions at once: their leases
// changed, or they woke. It never blocks.
func (w *watcher) poke() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// run waits to be elected, then watches until its session fails, and
// again, until ctx is cancelled.
func (w *watcher) run(ctx context.Context) error {
	defer w.close()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for ctx.Err() == nil {
		w.wait = 0
		if w.lead(ctx) {
			w.watch(ctx, t)
		}
		if w.wait > 0 {
			if _, done := w.pause(ctx, t, w.wait); done {
				return nil
			}
		}
	}
	return nil
}

// lead acquires the watcher's connection and waits on it until it holds
// the topic's watch key. It reports whether it does; when not, w.wait says
// how long to back off.
func (w *watcher) lead(ctx context.Context) bool {
	if !w.connect(ctx) {
		return false
	}
	// Once the session follows, appends that commit are announced (by the
	// elected watcher, or by this one once elected); the poll finds what
	// committed before.
	c := w.c
	if err := store.Follow(ctx, w.conn, c.cfg.TopicID, c.replicaID, followCheck); err != nil {
		w.fail(ctx, err)
		return false
	}
	c.pollNow(WakePoll)
	// While the key is held after followCheck, by a watcher whose replica
	// still heartbeats or by one that is frozen (or cut off), whose
	// session would keep the key, and leave the partitions it watched
	// awake to the poll, for as long as it lasts: the frozen one's session
	// is ended (awaitRole).
	err := awaitRole(ctx, w.conn, store.RoleWatcher, c.cfg.TopicID, &c.log, func(ctx context.Context) (bool, error) {
		elected, err := store.Lead(ctx, w.conn, c.cfg.TopicID)
		if err == nil {
			w.retry.Ok()
		}
		return elected, err
	})
	if err != nil {
		w.fail(ctx, err)
		return false
	}
	w.c.log.Info().Msg("elected the topic's watcher: it watches every partition and tells the other consumers which moved")
	// Everything is read, and announced, anew.
	clear(w.parts)
	w.readTailsNext = true
	w.wakeAll()
	return true
}

// watch watches while the watcher holds the key: until ctx ends or a
// statement fails.
func (w *watcher) watch(ctx context.Context, t *time.Timer) {
	interval := watchMin
	// The waits between reads while awake are below a millisecond, which
	// Go's timers round up to about a millisecond in an idle process: a
	// finetimer keeps them (ctx and pokes are looked at after each, at
	// most watchMax later).
	fine := finetimer.New()
	defer fine.Close()
	for ctx.Err() == nil && w.conn != nil {
		moved := w.appendsMovedAt
		awake := w.step(ctx)
		if w.wait > 0 || w.conn == nil {
			return // a statement failed: back off, and wait for the key again
		}
		if w.appendsMovedAt != moved {
			interval = watchMin
		} else {
			interval = min(2*interval, watchMax)
		}
		if awake {
			fine.Sleep(interval)
			select {
			case <-w.signal: // the next step looks
			default:
			}
			continue
		}
		interval = watchMin
		var check time.Duration // none: wait for a signal
		if len(w.asleep) > 0 {
			check = keysCheck
		}
		fired, done := w.pause(ctx, t, check)
		if done {
			return
		}
		if fired {
			w.checkKeys(ctx)
		}
	}
}

// pause waits, on t, for d (forever when d is 0), a signal or ctx's end.
// It reports whether d ran out, and whether ctx ended.
func (w *watcher) pause(ctx context.Context, t *time.Timer, d time.Duration) (fired, done bool) {
	var tick <-chan time.Time
	if d > 0 {
		t.Reset(d)
		tick = t.C
	}
	select {
	case <-ctx.Done():
		return false, true
	case <-w.signal:
		if d > 0 && !t.Stop() {
			select { // a tick that fired meanwhile (before Go 1.23's timers)
			case <-t.C:
			default:
			}
		}
		return false, false
	case <-tick:
		return true, false
	}
}

// checkKeys wakes every partition when the session holding the sleep keys
// is gone (fail releases what is left and drops the connection; the next
// step reads every tail on a new one).
func (w *watcher) checkKeys(ctx context.Context) {
	// CheckConn, not Ping: a ping is a statement, ten a second per idle
	// consumer. What it cannot see (a half-open connection: a cut network,
	// a host gone) ends the listener's connection too, and the listener's
	// reconnect wakes every partition.
	//lint:ignore SA1019 the deprecation prefers Ping, a round trip; see above
	if err := w.conn.Conn().PgConn().CheckConn(); err != nil {
		w.fail(ctx, fmt.Errorf("the session holding the sleep keys ended: %w", err))
	}
}

// step reads the tails of the awake partitions, announces what moved,
// hints this consumer's workers, and goes to sleep on the quiet ones. It
// reports whether a partition is still awake, that is, whether it should
// run again (after watchMin to watchMax). A failed statement ends the step
// (fail has dropped the connection; watch sees it and backs off).
func (w *watcher) step(ctx context.Context) bool {
	now := time.Now()
	parts, hintable := w.partitions()
	always, watchAlways := w.wakeMode(now)
	if !w.wakeAsked(ctx, len(parts), always, now) {
		return true
	}
	if always && !watchAlways {
		return false // every append notifies
	}
	awake := w.awakePartitions(parts, now)
	if len(awake) == 0 {
		return false
	}
	due, withCounter := w.tailsDue(ctx, now)
	if !due {
		return true
	}
	seen, ok := w.look(ctx, awake, withCounter, now)
	if !ok {
		return true
	}
	quiet := w.takeNews(awake, seen.Tails, hintable, now)
	if len(quiet) == 0 || always {
		return true
	}
	if !w.sleep(ctx, quiet, now) {
		return true
	}
	return len(w.asleep) < len(parts)
}

// partitions returns the partitions of the topic's layout, 0 to n-1 (every
// one is watched, whoever consumes it), and the workers of this consumer
// that may be hinted directly: those that hold their lease, are not halted,
// and whose group is not paused. An append in flight on one of them,
// caught up, is waited for by its claim.
func (w *watcher) partitions() ([]int, map[int]*worker) {
	c := w.c
	var parts []int
	hintable := map[int]*worker{}
	if rt := c.rt.Load(); rt != nil {
		parts = rt.order
		paused := c.paused.Load()
		for p, wk := range rt.workers {
			if wk.epoch.Load() > 0 && !wk.halted.Load() && !paused {
				hintable[p] = wk
			}
		}
	} else {
		for p := range c.cfg.TotalPartitions {
			parts = append(parts, p)
		}
	}
	return parts, hintable
}

// wakeMode reports whether the topic's wake-up mode is 'always' (every
// append notifies, and nobody sleeps), and if so whether the watcher must
// still watch: the appends that started under 'waiting' notify nobody, so
// they are watched to their commit first (alwaysGrace, then until none is
// in flight). A sequenced topic is always 'always', and never watched: its
// ticks announce every partition they move, whatever the mode.
func (w *watcher) wakeMode(now time.Time) (always, watchAlways bool) {
	always = w.c.wakeAlways.Load()
	switch {
	case !always:
		w.alwaysAt = time.Time{}
	case w.alwaysAt.IsZero():
		w.alwaysAt = now
	}
	return always, always && !w.c.sequenced && (now.Sub(w.alwaysAt) < alwaysGrace || w.inFlight)
}

// wakeAsked wakes the sleeping partitions that were asked to wake (by
// wake: a notification said an append found the partition asleep; by
// wakeAll; or by the mode 'always') and those the layout of n partitions
// no longer has, and forgets the latter. It reports false when the
// statement failed.
func (w *watcher) wakeAsked(ctx context.Context, n int, always bool, now time.Time) bool {
	w.mu.Lock()
	woken, all := w.woken, w.all
	w.woken, w.all = map[int]bool{}, false
	w.mu.Unlock()
	inLayout := func(p int) bool { return p >= 0 && p < n }
	var toWake []int
	for p := range w.asleep {
		if !inLayout(p) || all || woken[p] || always {
			toWake = append(toWake, p)
		}
	}
	if len(toWake) > 0 {
		if err := store.Wake(ctx, w.conn, w.c.cfg.TopicID, toWake); err != nil {
			w.fail(ctx, err)
			return false
		}
		for _, p := range toWake {
			delete(w.asleep, p)
			if wp := w.parts[p]; wp != nil {
				wp.activeAt = now
			}
		}
		w.readTailsNext = true
	}
	for p := range w.parts {
		if !inLayout(p) {
			delete(w.parts, p)
		}
	}
	if all {
		w.readTailsNext = true
	}
	return true
}

// awakePartitions returns the partitions of parts the watcher is not asleep
// on, and starts watching those it knew nothing of as if they had just been
// active, with a short mean gap: each stays awake at least quietMin.
func (w *watcher) awakePartitions(parts []int, now time.Time) []int {
	var awake []int
	for _, p := range parts {
		if !w.asleep[p] {
			awake = append(awake, p)
			if w.parts[p] == nil {
				w.parts[p] = &watched{activeAt: now, meanGap: quietMin / 5}
			}
		}
	}
	return awake
}

// tailsDue reports whether the tails are to be read now: they are when the
// appends counter moved within settle, fullEvery has passed since they were
// last read, a partition woke, or an append was in flight; else the counter
// is read first (one cheap round trip), since when no append started
// lately the tails cannot have moved and nothing is in flight. withCounter
// says that the counter is still to be read, in the tails' round trip. It
// reports false, too, when reading the counter failed.
func (w *watcher) tailsDue(ctx context.Context, now time.Time) (due, withCounter bool) {
	if w.mustReadTails(now) {
		return true, true
	}
	n, err := store.Appends(ctx, w.conn, w.c.cfg.TopicID)
	if err != nil {
		w.fail(ctx, err)
		return false, false
	}
	w.retry.Ok()
	w.counted(n, now)
	return w.mustReadTails(now), false
}

// mustReadTails reports whether the tails are to be read whatever the
// appends counter says (see tailsDue).
func (w *watcher) mustReadTails(now time.Time) bool {
	return now.Sub(w.appendsMovedAt) <= settle || now.Sub(w.tailsReadAt) >= fullEvery || w.readTailsNext || w.inFlight
}

// look reads the tails of the awake partitions, and the appends counter
// when withCounter, in one statement that also announces, to the
// consumers that follow the elected watcher, the tails that moved. It
// reports false when the statement failed.
func (w *watcher) look(ctx context.Context, awake []int, withCounter bool, now time.Time) (store.Seen, bool) {
	c := w.c
	l := store.Look{Topic: c.cfg.TopicID, Partitions: awake, Counter: withCounter, Known: make([]int64, len(awake))}
	for i, p := range awake {
		l.Known[i] = w.parts[p].tail
	}
	if ln := c.ln.Load(); ln != nil {
		l.Channel = ln.Channel()
	}
	seen, err := store.Watch(ctx, w.conn, l)
	if err != nil {
		w.fail(ctx, err)
		return seen, false
	}
	w.retry.Ok()
	if withCounter {
		w.counted(seen.Appends, now)
	}
	w.tailsReadAt, w.readTailsNext = now, false
	w.inFlight = false
	return seen, true
}

// takeNews records the tails read of the awake partitions, hints the
// hintable workers whose tail moved (or that wait for an append in
// flight), and returns the partitions that have been quiet long enough
// to sleep on: quietGaps of their mean gaps, within quietMin and quietMax.
func (w *watcher) takeNews(awake []int, tails []store.Tail, hintable map[int]*worker, now time.Time) []int {
	obs := w.c.cfg.Observer
	var quiet []int
	for i, p := range awake {
		wp, tl := w.parts[p], tails[i]
		if tl.Offset > wp.tail {
			// The gap between moves of the tail, not between news: a
			// wake-up (a notification, an append in flight) is news that
			// the tail moves next, and would shrink the gap to nothing
			// (and the partition would sleep between its events, each of
			// which would then notify).
			if !wp.movedAt.IsZero() {
				wp.meanGap = (4*wp.meanGap + now.Sub(wp.movedAt)) / 5
			}
			wp.tail, wp.activeAt, wp.movedAt = tl.Offset, now, now
		}
		wk := hintable[p]
		switch {
		case tl.Offset > 0 && wk != nil && wk.hint(tl.Offset):
			obs.Woken(p, WakeTail)
		case tl.InFlight:
			w.inFlight = true
			wp.activeAt = now
			if wk != nil && wk.awaitAppend() {
				// The worker, caught up, waits in its claim for the
				// append in flight and reads its events as soon as they
				// commit.
				obs.Woken(p, WakeInFlight)
			}
		case now.Sub(wp.activeAt) >= min(max(quietGaps*wp.meanGap, quietMin), quietMax):
			quiet = append(quiet, p)
		}
	}
	return quiet
}

// sleep goes to sleep on the quiet partitions: it takes their sleep keys,
// where no append holds them or is in flight, and wakes again at once the
// ones whose tail moved before the key was held (the next look reads and
// announces it). It reports false when a statement failed.
func (w *watcher) sleep(ctx context.Context, quiet []int, now time.Time) bool {
	topic := w.c.cfg.TopicID
	slept, err := store.Sleep(ctx, w.conn, topic, quiet)
	if err != nil {
		w.fail(ctx, err)
		return false
	}
	var committedMeanwhile []int
	for i, p := range quiet {
		if !slept[i].Got {
			continue // an append holds the key, or is in flight: it commits soon
		}
		w.asleep[p] = true
		wp := w.parts[p]
		wp.movedAt = time.Time{} // no gap is measured across a sleep
		if slept[i].Tail > wp.tail {
			// An append committed before the key was taken: awake after
			// all, and the next look reads (and announces) its tail.
			wp.activeAt = now
			committedMeanwhile = append(committedMeanwhile, p)
		}
	}
	if len(committedMeanwhile) > 0 {
		if err := store.Wake(ctx, w.conn, topic, committedMeanwhile); err != nil {
			w.fail(ctx, err)
			return false
		}
		for _, p := range committedMeanwhile {
			delete(w.asleep, p)
		}
		w.readTailsNext = true
	}
	return true
}

// counted records the appends counter n, read at now.
func (w *watcher) counted(n int64, now time.Time) {
	if n != w.appends || n < 0 {
		w.appends, w.appendsMovedAt = n, now
	}
}

// connect acquires the watcher's connection when it has none, and reports
// whether it has one.
func (w *watcher) connect(ctx context.Context) bool {
	if w.conn != nil {
		return true
	}
	conn, err := w.c.pool.Acquire(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.wait = w.retry.Fail(err, "watcher: no connection; events wait for notifications or the poll")
		}
		return false
	}
	w.conn = conn
	return true
}

// fail drops the watcher's connection after an error, and with it the
// watch key and every sleep key it held: every partition is awake again,
// and read by the watcher elected next.
func (w *watcher) fail(ctx context.Context, err error) {
	if ctx.Err() == nil {
		w.wait = w.retry.Fail(err, "watcher: statement failed; giving up the watch key and waiting for it again")
	}
	w.close()
}

// close closes the watcher's connection, which releases the sleep keys it
// holds (a connection given back to the pool would keep them).
func (w *watcher) close() {
	if w.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = w.conn.Conn().Close(ctx)
	cancel()
	w.conn.Release()
	w.conn = nil
	clear(w.asleep)
}
