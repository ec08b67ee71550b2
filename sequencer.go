package pgevents

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/finetimer"
	"github.com/pgevents/pgevents/internal/store"
)

// The sequencer's timing.
const (
	// tickPause is the wait before the next tick when a tick found nothing
	// and an append is in flight (its commit will come, and nobody
	// notifies the sequencer of it): the bound on the sequencer's share of
	// an event's latency while producers are busy, and on its rate of
	// empty looks (each one an index probe).
	tickPause = 300 * time.Microsecond
	// idleCheck is how long an idle sequencer waits for a notification
	// before it looks again on its own: it covers a notification lost with
	// a dropped connection of the producer's side.
	idleCheck = time.Second
	// rotateEvery is how often the sequencer rotates the staging tables
	// (rotate_stage): a staging table holds about two periods of events.
	rotateEvery = 10 * time.Second
)

// sequencer runs the ticks of the consumer's topic when it is a sequenced
// topic (migration 0016). Every consumer of the topic runs one; they wait
// for the topic's sequencer key on a connection of their own, and the one
// holding it ticks: it moves what producers committed in the staging
// tables into the log, as soon as it committed. A tick that finds nothing
// is followed by another after tickPause while appends are in flight;
// with none in flight, the sequencer sleeps until an append notifies it.
type sequencer struct {
	c     *Consumer
	retry *backoff.Retry
}

// run sequences until ctx is cancelled; it returns at once when the topic
// is not sequenced.
func (s *sequencer) run(ctx context.Context) error {
	ok, err := store.Sequenced(ctx, s.c.pool, s.c.cfg.TopicID)
	if err != nil || !ok {
		return nil // not sequenced (a failure to tell is the consumer's own to report)
	}
	s.retry = backoff.New(s.c.log, "sequencer")
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for ctx.Err() == nil {
		err := s.lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		t.Reset(s.retry.Fail(err, "sequencer: failed; its connection is closed, and the sequencer key with it"))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return nil
}

// lead connects, waits for the sequencer key and ticks while it holds it.
func (s *sequencer) lead(ctx context.Context) error {
	cfg := s.c.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = "pgevents sequencer " + s.c.replicaID
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	topic := s.c.cfg.TopicID
	if err := store.LeaseSequencer(ctx, conn, topic); err != nil {
		return err
	}
	s.retry.Ok()
	s.c.log.Info().Msg("sequencing the topic: this process moves what producers commit into the log")
	fine := finetimer.New()
	defer fine.Close()
	rotated := time.Now()
	payload := strconv.Itoa(topic)
	for ctx.Err() == nil {
		n, err := store.Tick(ctx, conn, topic)
		if err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		if time.Since(rotated) >= rotateEvery {
			rotated = time.Now()
			if _, err := store.RotateStage(ctx, conn, topic); err != nil {
				return err
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
		// Asleep: every append from now on notifies; what committed
		// before is found by this tick.
		n, err = store.Tick(ctx, conn, topic)
		if err == nil && n == 0 {
			err = waitFor(ctx, conn, payload, idleCheck)
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

// waitFor waits until conn receives a notification with payload, or for
// d, or until ctx ends (then it returns nil: the caller sees ctx).
func waitFor(ctx context.Context, conn *pgx.Conn, payload string, d time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			if wctx.Err() != nil && !conn.IsClosed() {
				return nil
			}
			return err
		}
		if n.Payload == payload {
			return nil
		}
	}
}
