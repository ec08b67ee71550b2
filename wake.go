package pgevents

import (
	"context"
	"sync"
	"time"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/listener"
	"github.com/pgevents/pgevents/schema"
)

// This file: how a consumer's workers are woken. The watcher (watcher.go)
// finds the events committed while partitions are awake; the listener's
// notifications reach sink.Notify; the poll, every WaitPeriod, is the
// safety net; Consumer.eligible wakes a partition that becomes eligible
// again. The protocol: see docs/concepts.md, "How a sleeping partition
// wakes".

// poll asks the database, at start and every WaitPeriod, which partitions
// have events beyond the group's position, and wakes their workers: the
// safety net for lost notifications. A (re)connect of the listener, or a
// notification that names no partition, makes it poll at once; one query
// answers for every partition the consumer serves.
func (c *Consumer) poll(ctx context.Context) error {
	t := time.NewTicker(c.cfg.WaitPeriod)
	defer t.Stop()
	source := WakePoll
	for {
		c.pollOnce(ctx, source)
		// After a failure, no poll before the backoff, kicked or not.
		if d := c.polling.Backoff(); d > 0 && !backoff.Sleep(ctx, d) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			source = WakePoll
		case source = <-c.kick:
		}
	}
}

// eligible wakes partitions ps (every partition of the consumer when ps
// is empty) that became eligible again: the group was resumed (or the
// consumer started while it was paused), a partition was unhalted, its
// lease was gained, the layout switched, the topic's wake-up mode changed.
// It is the one place such a change wakes partitions, and every such
// change must call it.
//
// Why it is needed: while a partition is not eligible (paused, halted,
// not owned, notifying on every append), the watcher neither reads its
// tail nor holds its sleep key, so an append to it finds nobody asleep and
// notifies nobody. Once it is eligible again, the watcher must read its
// tail (and sleep on it again once it is quiet, so that the next append
// notifies), and the poller must look for what was appended meanwhile;
// otherwise the next event would wait for the poll. It never blocks.
func (c *Consumer) eligible(ps ...int) {
	c.pollNow(WakePoll)
	if len(ps) == 0 {
		c.watch.wakeAll()
		return
	}
	for _, p := range ps {
		c.watch.wake(p)
	}
}

// pollNow makes the poller poll at once. It never blocks.
func (c *Consumer) pollNow(source WakeSource) {
	select {
	case c.kick <- source:
	default:
	}
}

// recheck makes the consumer read its group's state at once: the
// subscription's state (a resume, a pause, a cancel) and the halted
// partitions' records (an unhalt), as the subscription's heartbeat and a
// halted worker's check would later; what became eligible again is woken
// through eligible. A notification of the topic that names no partition
// asks for it: an operator's resume, unhalt or reset, and a layout switch,
// send one at their commit (store.NotifyEligible), so that the next event
// is handled within milliseconds of the command, not at the next
// heartbeat or check. The subscription's loop does the reading, at most
// once per recheckEvery: such notifications also come with every look of
// a watcher that names too many partitions for one payload. It never
// blocks.
func (c *Consumer) recheck() {
	select {
	case c.rechecks <- struct{}{}:
	default:
	}
}

// recheckEvery is the least time between two rechecks of a consumer: a
// recheck asked for meanwhile waits for it, and is not lost.
const recheckEvery = 10 * time.Millisecond

// broadcast wakes every goroutine that waits on it, at once.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel that the next fire closes.
func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// fire closes the channel wait returned. It never blocks.
func (b *broadcast) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

func (c *Consumer) pollOnce(ctx context.Context, source WakeSource) {
	rt := c.rt.Load()
	if rt == nil {
		return
	}
	if !c.checkLayout(ctx, rt) {
		return
	}
	c.refreshWake(ctx, rt)
	before := time.Now()
	work, dbNow, err := store.Pending(ctx, control{c}, c.cfg.GroupID, c.cfg.TopicID, rt.order, rt.layout.Version)
	if err != nil {
		if ctx.Err() == nil {
			c.polling.Fail(err, "poll failed")
		}
		return
	}
	c.polling.Ok()
	c.polls.Add(1)
	// The database read its clock about halfway through the round trip.
	after := time.Now()
	c.clockSkew.Store(int64(dbNow.Sub(before.Add(after.Sub(before) / 2))))
	for _, wk := range work {
		c.hintWorker(rt, wk.Partition, wk.MaxOffset, source)
	}
}

// refreshWake reads the topic's wake-up mode. When it changed from
// 'always' to 'waiting' (schema.SetWake, which notifies the topic's
// consumers to poll at once), appends notify only partitions a consumer
// sleeps on, and the watcher, which did not read the tails under 'always',
// reads them again: no event appended since waits for the poll.
//
// It also follows a change of the topic's channel (schema.SetChannel, which
// notifies the old channel so that consumers poll at once): the listener
// listens on the new channel, and polls once it does.
func (c *Consumer) refreshWake(ctx context.Context, rt *layoutRun) {
	wake, channel, err := schema.TopicWake(ctx, control{c}, c.cfg.TopicID)
	if err != nil {
		if ctx.Err() == nil {
			c.polling.Fail(err, "could not read the topic's wake-up mode")
		}
		return
	}
	if ln := c.ln.Load(); ln != nil && ln.Channel() != channel {
		ev := c.log.Info()
		if c.cfg.Channel != "" {
			ev = c.log.Warn().Str("configured", c.cfg.Channel)
		}
		ev.Str("from", ln.Channel()).Str("to", channel).Msg("the topic's channel changed: listening on the new one (set channel in the configuration, or leave it unset, before the next start)")
		ln.SetChannel(channel)
		c.warnSharedChannel(ctx, channel)
	}
	always := c.notifiesAlways(wake)
	if c.wakeAlways.Swap(always) && !always {
		c.log.Info().Msg("the topic's wake-up mode is now 'waiting': appends notify only partitions a consumer sleeps on")
		c.eligible()
	}
}

// sink receives the listener's wake-ups.
type sink Consumer

func (s *sink) Notify(topic, p int, maxOffset int64) {
	c := (*Consumer)(s)
	if topic != c.cfg.TopicID && topic != 0 {
		return
	}
	if p < 0 {
		c.pollNow(WakePoll)
		c.watch.wakeAll()
		if topic == c.cfg.TopicID {
			c.recheck()
		}
		return
	}
	if rt := c.rt.Load(); rt != nil {
		c.hintWorker(rt, p, maxOffset, WakeNotify)
	}
	// Events flow again in the partition: the watcher reads its tail, and
	// appends stop notifying it.
	c.watch.wake(p)
}

// hintWorker tells this consumer's worker of partition p, if it runs one,
// that the partition has events up to maxOffset, and the observer when
// that woke it (source: what found them).
func (c *Consumer) hintWorker(rt *layoutRun, p int, maxOffset int64, source WakeSource) {
	if w := rt.workers[p]; w != nil && w.hint(maxOffset) {
		c.cfg.Observer.Woken(p, source)
	}
}

// ticked receives the announcement of a tick that this consumer's
// sequencer ran (localTicks), at the tick's commit, and wakes the workers
// of the partitions it moved; a payload of another form is left to the
// listener, which receives it too.
func (c *Consumer) ticked(payload string) {
	rt := c.rt.Load()
	if rt == nil {
		return
	}
	_ = listener.Decode(payload, func(topic, p int, maxOffset int64) {
		if topic == c.cfg.TopicID && p >= 0 {
			c.hintWorker(rt, p, maxOffset, WakeTick)
		}
	})
}

func (s *sink) Connected() {
	c := (*Consumer)(s)
	// Look, for every partition, for events committed while nobody
	// listened, and wake the workers that have some.
	reconnect := false
	if ln := c.ln.Load(); ln != nil {
		reconnect = ln.Connects() > 1
	}
	c.cfg.Observer.ListenerConnected(reconnect)
	c.pollNow(WakeReconnect)
	c.watch.wakeAll()
}
