package pgevents

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// TestAppendToMissingTopic: every way of appending from Go to a topic that
// does not exist fails with an error that says how to create it (the hint
// the SQL path gives), wraps schema.ErrTopicNotFound and the server's
// SQLSTATE 23503, and that Classify calls a deployment failure, not a
// permanent one.
func TestAppendToMissingTopic(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 2)
	appends := map[string]func() error{
		"Append one": func() error {
			_, err := Append(ctx, pool, Event{TopicID: 9, HostID: "h", EventType: "t"})
			return err
		},
		"Append several": func() error {
			_, err := Append(ctx, pool, Event{TopicID: 9, HostID: "h", EventType: "t"}, Event{TopicID: 9, HostID: "i", EventType: "t"})
			return err
		},
		"AppendResults": func() error {
			_, err := AppendResults(ctx, pool, Event{TopicID: 9, HostID: "h", EventType: "t"})
			return err
		},
		"Append keyed": func() error {
			_, err := Append(ctx, pool, Event{TopicID: 9, HostID: "h", EventType: "t", IdempotencyKey: "k"})
			return err
		},
		"AppendCommit": func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			_, err = AppendCommit(ctx, tx, Event{TopicID: 9, HostID: "h", EventType: "t"})
			return err
		},
	}
	for name, appendTo := range appends {
		err := appendTo()
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			t.Errorf("%s to topic 9, which does not exist, succeeded", name)
		case !strings.Contains(err.Error(), "topic 9 does not exist") || !strings.Contains(err.Error(), "consumer migrate"):
			t.Errorf("%s: %q does not say how to create the topic", name, err)
		case !errors.Is(err, schema.ErrTopicNotFound) || !errors.As(err, &pgErr) || pgErr.Code != "23503":
			t.Errorf("%s: %v wraps neither schema.ErrTopicNotFound nor the server's 23503", name, err)
		case Classify(err) != ClassDeployment:
			t.Errorf("%s: Classify(%v) = %s, want deployment", name, err, Classify(err))
		}
	}
	// A foreign-key violation of the application's own stays permanent.
	mustExec(t, pool, `CREATE TABLE public.parents (id int PRIMARY KEY); CREATE TABLE public.children (parent int REFERENCES public.parents)`)
	_, err := pool.Exec(ctx, `INSERT INTO public.children VALUES (1)`)
	if Classify(err) != ClassPermanent {
		t.Errorf("Classify(%v) = %s, want permanent", err, Classify(err))
	}
}

// TestHandlerAppendsToMissingTopic: a handler that appends to a topic not
// created yet (a fan-out to another topic) is retried as a deployment
// failure, nothing dead-lettered, and the event is handled once the topic
// exists.
func TestHandlerAppendsToMissingTopic(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 2)
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		_, err := Append(ctx, tx, Event{TopicID: 2, HostID: ev.HostID, EventType: "copied"})
		return err
	}))
	c := startConsumer(t, pool, Config{Handlers: hs, TotalPartitions: 2, RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond})
	appendTx(t, pool, ev("h", "t", `{}`))
	pgtest.WaitFor(t, 20*time.Second, "the batch fails as a deployment failure", func() bool { return c.Stats().DeploymentFailures >= 3 })
	if n := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); n != 0 {
		t.Fatalf("%d dead letters: an append to a missing topic is a deployment failure, never the event's", n)
	}
	if _, _, err := schema.EnsureTopic(ctx, pool, 2, 2); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the event handled once topic 2 exists", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 2`) == 1
	})
}
