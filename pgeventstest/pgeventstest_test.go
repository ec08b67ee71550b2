package pgeventstest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/pgeventstest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestStartConsumer: the consumer it starts handles what is appended, in
// the handler's transaction, and a second Run of the same Consumer is
// refused while the first goes on.
func TestStartConsumer(t *testing.T) {
	t.Parallel()
	pool := pgtest.TopicPool(t, 2)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE public.seen (host text, c_offset bigint)`); err != nil {
		t.Fatal(err)
	}
	hs := &pgevents.Handlers{}
	hs.HandleAll(pgevents.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO public.seen VALUES ($1, $2)`, ev.HostID, ev.Offset)
		return err
	}))
	c, _ := pgeventstest.StartConsumer(t, pool.Config().ConnString(), pgevents.Config{
		GroupID: "g", TotalPartitions: 2, Handlers: hs, Schema: pgtest.Schema(),
	})
	again, cancel := context.WithTimeout(ctx, 5*time.Second) // a second consumer would run until then
	defer cancel()
	if err := c.Run(again); !errors.Is(err, pgevents.ErrAlreadyStarted) {
		t.Fatalf("second Run = %v, want ErrAlreadyStarted", err)
	}
	if _, err := pgevents.Append(pgtest.Context(ctx), pool,
		pgevents.Event{HostID: "a", EventType: "t"}, pgevents.Event{HostID: "b", EventType: "t"}); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 10*time.Second, "both events handled", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM public.seen`).Scan(&n)
		return n == 2
	})
}
