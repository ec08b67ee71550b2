package pgeventstest_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/sinktest"
	"github.com/pgevents/pgevents/pgeventstest"
	"github.com/pgevents/pgevents/schema"
)

// TestNewDB: a database per call, migrated, with the topic asked for (or
// none), pgevents in the schema asked for beside an empty public.
func TestNewDB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lookup := func(url, schemaName string, id int) (schema.Topic, error) {
		t.Helper()
		pool := pgeventstest.NewPool(t, url)
		return schema.LookupTopic(schema.WithName(ctx, schemaName), pool, id)
	}

	a, b := pgeventstest.NewDB(t, nil), pgeventstest.NewDB(t, nil)
	if a == b {
		t.Fatal("two NewDB calls gave one database")
	}
	if topic, err := lookup(a, "", pgevents.DefaultTopic); err != nil || topic.Partitions != pgeventstest.DefaultPartitions {
		t.Fatalf("default topic: %+v, %v; want topic 1 of %d partitions", topic, err, pgeventstest.DefaultPartitions)
	}
	if _, err := pgevents.Append(ctx, pgeventstest.NewPool(t, a), pgevents.Event{HostID: "h", EventType: "t"}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pgeventstest.NewPool(t, b).QueryRow(ctx, `SELECT count(*) FROM outbox_message_t`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the other database holds %d events (%v), want 0", n, err)
	}

	inSchema := pgeventstest.NewDB(t, &pgeventstest.DBOptions{Schema: "app_events", Topic: schema.TopicSpec{ID: 3, Partitions: 2}})
	if topic, err := lookup(inSchema, "app_events", 3); err != nil || topic.Partitions != 2 {
		t.Fatalf("topic 3 in schema app_events: %+v, %v", topic, err)
	}
	var public *string
	if err := pgeventstest.NewPool(t, inSchema).QueryRow(ctx, `SELECT to_regclass('public.log_counter')::text`).Scan(&public); err != nil || public != nil {
		t.Fatalf("public.log_counter = %v (%v), want none: pgevents belongs in app_events", public, err)
	}

	bare := pgeventstest.NewDB(t, &pgeventstest.DBOptions{NoTopic: true})
	if _, err := lookup(bare, "", pgevents.DefaultTopic); !errors.Is(err, schema.ErrTopicNotFound) {
		t.Fatalf("NoTopic: looking topic 1 up = %v, want ErrTopicNotFound", err)
	}
}

// TestRecorderRecordsCommits: a Recorder records what committed, once,
// although the consumer handles part of a batch, fails, and handles it
// again: WaitHandled sees every event exactly once and RequireInOrder
// passes; a handler error is returned, and its event not recorded.
func TestRecorderRecordsCommits(t *testing.T) {
	t.Parallel()
	url := pgeventstest.NewDB(t, &pgeventstest.DBOptions{Topic: schema.TopicSpec{Partitions: 2}})
	var failed atomic.Int32
	rec := &pgeventstest.Recorder{Next: pgevents.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
		if ev.EventType == "flaky" && failed.Add(1) <= 2 {
			return pgevents.Retryable(errors.New("not yet"))
		}
		return nil
	})}
	hs := &pgevents.Handlers{}
	hs.HandleAll(rec)
	pgeventstest.StartConsumer(t, url, pgevents.Config{GroupID: "g", TotalPartitions: 2, Handlers: hs,
		RetryInitial: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})

	pool := pgeventstest.NewPool(t, url)
	total := 0
	for i := range 10 {
		// Each transaction's events are one unit per host, handled in one
		// batch; the flaky one fails that batch twice after the events
		// before it were handled.
		evs := []pgevents.Event{{HostID: fmt.Sprint("h", i%3), EventType: "t"}, {HostID: fmt.Sprint("h", i%3), EventType: "t"}}
		if i == 4 {
			evs = append(evs, pgevents.Event{HostID: "h1", EventType: "flaky"}, pgevents.Event{HostID: "h1", EventType: "t"})
		}
		sinktest.AppendTx(t, pool, evs...)
		total += len(evs)
	}
	rec.WaitHandled(t, total, 20*time.Second)
	rec.RequireInOrder(t)
	if failed.Load() < 3 {
		t.Fatalf("the flaky event was tried %d times, want 3: the test proves nothing", failed.Load())
	}
}
