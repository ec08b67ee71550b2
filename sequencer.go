package pgevents

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/finetimer"
	"github.com/pgevents/pgevents/internal/store"
)

// The sequencer's timing.
const (
	// tickPause is the wait before the next tick after a tick that moved
	// events, or that found nothing while an append is in flight (its
	// commit will come, and nobody notifies the sequencer of it): the bound
	// on the sequencer's share of an event's latency while producers are
	// busy, and on its rate of ticks (measured at 1,000 single-event
	// transactions a second, four runs each way: with the pause after a
	// moving tick, the sequencer's session spent 11 % less CPU per event,
	// the machine 9 % less, and COMMIT → handler p50 stayed within the
	// runs' spread).
	tickPause = 300 * time.Microsecond
	// idleCheck is how long an idle sequencer waits for a notification
	// before it looks again on its own: it covers a notification lost with
	// a dropped connection of the producer's side.
	idleCheck = time.Second
	// rotateEvery is how often the sequencer rotates the staging tables
	// (rotate_stage): a staging table holds about two periods of events.
	rotateEvery = 10 * time.Second
	// rotateRetry is how soon a rotation that rotate_stage refused is
	// tried again. It refuses while a producer transaction that wrote into
	// the generation to empty is open, or its events are not sequenced
	// yet: tried again a period later, the rotation would wait up to a
	// period more after that transaction ended.
	rotateRetry = time.Second
)

// sequencerTiming is a sequencer's timing: the rotation's (rotateEvery
// and rotateRetry, which a test shortens) and the idle sequencer's look
// (idleCheck, which a test lengthens to see that appends wake it), set by
// a test through the context it gives Sequence (timingKey; a zero idle
// means idleCheck).
type sequencerTiming struct{ every, retry, idle time.Duration }

// timingKey is the context key of a test's sequencerTiming.
type timingKey struct{}

// Sequence runs the sequencer of topic, a sequenced topic (offset scope
// "sequenced"), on connections configured as pool's, until ctx is
// cancelled; it returns nil then, and ErrNotSequenced at once for a topic
// of another scope. Every consumer process of a sequenced topic runs it;
// `consumer maintain` runs it too, so that a topic whose producers append
// while no consumer runs still moves. name tells the process apart in
// pg_stat_activity (application_name "pgevents sequencer <name>").
//
// The sequencers of a topic wait for its sequencer key (a session advisory
// lock) on a connection of their own, and every 2 s look whether its
// holder is frozen (its replica no longer heartbeats, and its session has
// run no statement for 2 s): then they end its session, and one of them
// takes the key over. The one holding it ticks: each tick
// moves what producers committed in the staging tables since the previous
// one into the log (migration 0016), and notifies the topic's channel of
// every partition it moved (0023). A tick that moved events is followed by
// another after 0.3 ms, as is one that found nothing while appends are in
// flight; with none in flight, the sequencer sleeps until an append
// notifies it. Failures (a dropped connection, a session
// ended) are logged, and it connects again with backoff.
func Sequence(ctx context.Context, pool *pgxpool.Pool, topic int, name string, log *zerolog.Logger) error {
	return sequence(ctx, pool, topic, name, log, nil)
}

// localTicks lets the consumer that runs a sequencer hear the
// announcements of the ticks its sequencer runs on the sequencer's own
// session: it listens on the topic's channel too, and PostgreSQL delivers
// a session's own notification at its commit, in the reply to the tick's
// statement. The consumer's workers of the partitions a tick moved are
// woken then, without waiting for the copy its listener's session
// receives (the server signals that session, which wakes the listener's
// goroutine, which wakes the worker); that copy finds them woken.
type localTicks struct {
	// channel returns the topic's channel; it is read before every tick
	// (sequencer.follow), and must be cheap.
	channel func() string
	// announce receives the payload of a tick's announcement, in the
	// sequencer's goroutine; it must not block.
	announce func(payload string)
}

// sequence is Sequence, with local (nil: none) told of the ticks'
// announcements.
func sequence(ctx context.Context, pool *pgxpool.Pool, topic int, name string, log *zerolog.Logger, local *localTicks) error {
	l := log.With().Int("topic", topic).Logger()
	s := &sequencer{pool: pool, topic: topic, name: name, log: &l, retry: backoff.New(l, "sequencer"),
		timing: sequencerTiming{every: rotateEvery, retry: rotateRetry, idle: idleCheck}, local: local, payload: strconv.Itoa(topic)}
	if tm, ok := ctx.Value(timingKey{}).(sequencerTiming); ok {
		s.timing = tm
		if s.timing.idle == 0 {
			s.timing.idle = idleCheck
		}
	}
	for {
		ok, err := store.Sequenced(ctx, pool, topic)
		if err == nil && !ok {
			return fmt.Errorf("pgevents: topic %d: %w", topic, ErrNotSequenced)
		}
		if err == nil {
			break
		}
		if !backoff.Sleep(ctx, s.retry.Fail(err, "sequencer: cannot tell whether the topic is sequenced")) {
			return nil
		}
	}
	s.retry.Ok()
	return prefixed(s.run(ctx))
}

// ErrNotSequenced is returned by Sequence for a topic that is not
// sequenced.
var ErrNotSequenced = errors.New("not a sequenced topic")

// sequencer is Sequence's state.
type sequencer struct {
	pool  *pgxpool.Pool
	topic int
	name  string
	log   *zerolog.Logger
	retry *backoff.Retry
	// timing is the rotation's and the idle look's.
	timing sequencerTiming
	// local, when not nil, hears the ticks' announcements (localTicks), on
	// channel, the channel the session listens on (follow).
	local   *localTicks
	channel string
	// payload is an append's wake-up on store.SequencerChannel (the
	// topic's id); woken says that one arrived since the sequencer went to
	// sleep (notified sets it).
	payload string
	woken   atomic.Bool
}

// notified receives the notifications of the sequencer's session while a
// statement or a wait reads its connection: an append's wake-up of the
// sleeping sequencer, and, with local, the session's own announcements
// (those whose sender is this session) on the topic's channel.
func (s *sequencer) notified(pc *pgconn.PgConn, n *pgconn.Notification) {
	switch {
	case n.Channel == store.SequencerChannel:
		if n.Payload == s.payload {
			s.woken.Store(true)
		}
	case s.local != nil && n.PID == pc.PID() && n.Channel == s.channel:
		s.local.announce(n.Payload)
	}
}

// run sequences until ctx is cancelled.
func (s *sequencer) run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := s.lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		backoff.Sleep(ctx, s.retry.Fail(err, "sequencer: failed; its connection is closed, and the sequencer key with it"))
	}
	return nil
}

// lead connects, waits for the sequencer key and ticks while it holds it.
func (s *sequencer) lead(ctx context.Context) error {
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = store.RoleSequencer.ApplicationName(s.name)
	// The wait for the sequencer key lasts as long as another process
	// sequences: no statement timeout. (Its commits are asynchronous, as
	// the pool's are: a crash can lose the last ticks, whose events stay
	// staged and are sequenced again, with the event ids they were staged
	// with.)
	cfg.RuntimeParams["statement_timeout"] = "0"
	cfg.OnNotification = s.notified
	s.channel = "" // a new session listens on nothing yet (follow)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	topic := s.topic
	// Every roleCheck, a frozen holder's session is ended (roles.go).
	if err := awaitRole(ctx, conn, store.RoleSequencer, topic, s.log, nil); err != nil {
		return err
	}
	if err := store.ListenSequencer(ctx, conn); err != nil {
		return err
	}
	s.retry.Ok()
	s.log.Info().Msg("sequencing the topic: this process moves what producers commit into the log")
	fine := finetimer.New()
	defer fine.Close()
	rotateAt := time.Now().Add(s.timing.every) // the next rotation's
	for ctx.Err() == nil {
		if err := s.follow(ctx, conn); err != nil {
			return err
		}
		n, err := store.Tick(ctx, conn, topic)
		if err != nil {
			return err
		}
		if n > 0 {
			// The next tick after a pause too: ticking at once mostly
			// finds nothing at a steady rate (its empty look and the sleep
			// key's try then cost two statements), and under a burst it
			// moves more at a time.
			fine.Sleep(tickPause)
			continue
		}
		if !time.Now().Before(rotateAt) {
			ok, err := store.RotateStage(ctx, conn, topic)
			if err != nil {
				return err
			}
			rotateAt = time.Now().Add(s.timing.every)
			if !ok {
				rotateAt = time.Now().Add(s.timing.retry) // a producer's transaction holds it
			}
		}
		asleep, err := store.SequencerSleep(ctx, conn, topic)
		if err != nil {
			return err
		}
		if !asleep {
			fine.Sleep(tickPause) // an append is in flight
			continue
		}
		// Asleep: every append from now on notifies (a wake-up that came
		// before is stale); what committed before is found by this tick.
		s.woken.Store(false)
		n, err = store.Tick(ctx, conn, topic)
		if err == nil && n == 0 {
			err = s.waitWoken(ctx, conn, s.timing.idle)
		}
		if err != nil {
			return err
		}
		if err := store.SequencerAwake(ctx, conn, topic); err != nil {
			return err
		}
	}
	return nil
}

// follow makes the session listen on the topic's channel as local reads
// it now, before a tick: the consumer's listener follows a channel change
// (schema.SetChannel), and so must the sequencer's session, or the ticks'
// announcements would no longer reach the consumer's workers before the
// listener's copy. Without local, it does nothing.
func (s *sequencer) follow(ctx context.Context, conn *pgx.Conn) error {
	if s.local == nil {
		return nil
	}
	ch := s.local.channel()
	if ch == s.channel {
		return nil
	}
	if s.channel != "" {
		if _, err := conn.Exec(ctx, `UNLISTEN `+pgx.Identifier{s.channel}.Sanitize()); err != nil {
			return fmt.Errorf("stop listening on %q: %w", s.channel, err)
		}
		s.channel = ""
	}
	if ch != "" {
		if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("listen for the ticks' announcements on %q: %w", ch, err)
		}
	}
	s.channel = ch
	return nil
}

// waitWoken waits until an append wakes the sleeping sequencer (notified
// sets woken; one may have come during the last statement), or for d, or
// until ctx ends (then it returns nil: the caller sees ctx).
func (s *sequencer) waitWoken(ctx context.Context, conn *pgx.Conn, d time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for !s.woken.Load() {
		if err := conn.PgConn().WaitForNotification(wctx); err != nil {
			if wctx.Err() != nil && !conn.IsClosed() {
				return nil
			}
			return err
		}
	}
	return nil
}

// Staged is what SequenceStaged did.
type Staged struct {
	// Sequenced says that the topic is sequenced; nothing else is set
	// when it is not.
	Sequenced bool
	// Busy says that another process holds the topic's sequencer key: it
	// moves the staged events, and SequenceStaged did nothing.
	Busy bool
	// Moved is the number of events the ticks moved into the log.
	Moved int
}

// SequenceStaged runs ticks of topic's sequencer on pool until one moves
// nothing, unless another process holds the topic's sequencer key (then it
// moves them; a frozen holder's session is ended, and SequenceStaged
// sequences). It is `consumer maintain --once`, for cron. log, when not
// nil, is told of a frozen holder's session ended.
func SequenceStaged(ctx context.Context, pool *pgxpool.Pool, topic int, log *zerolog.Logger) (Staged, error) {
	var st Staged
	ok, err := store.Sequenced(ctx, pool, topic)
	if err != nil || !ok {
		return st, prefixed(err)
	}
	st.Sequenced = true
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return st, fmt.Errorf("pgevents: %w", err)
	}
	// Closed, not given back: the session may hold the sequencer key.
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Conn().Close(cctx)
		cancel()
		conn.Release()
	}()
	// Named as the sequencer of `consumer maintain`, so that a frozen
	// process's session holding the key is ended by the others.
	if _, err := conn.Exec(ctx, `SELECT set_config('application_name', $1, false)`, store.RoleSequencer.ApplicationName("maintain")); err != nil {
		return st, fmt.Errorf("pgevents: %w", err)
	}
	held, err := takeRole(ctx, conn, store.RoleSequencer, topic, log)
	if err != nil {
		return st, fmt.Errorf("pgevents: %w", err)
	}
	if !held {
		st.Busy = true
		return st, nil
	}
	for {
		n, err := store.Tick(ctx, conn, topic)
		if err != nil {
			return st, fmt.Errorf("pgevents: %w", err)
		}
		if n == 0 {
			return st, nil
		}
		st.Moved += n
	}
}
