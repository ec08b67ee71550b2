package offsets_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/pgeventstest"
)

// A group handled three events; an operator previews a replay from the
// start, does it, and reads the group's lag.
func ExampleReset() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgeventstest.ExampleDB(nil)) // migrated, topic 1 of 8 partitions
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	handleThree(ctx, pool, "billing")

	preview, err := offsets.Preview(ctx, pool, "billing", pgevents.DefaultTopic, offsets.Start{Kind: offsets.Earliest}, false)
	if err != nil {
		log.Fatal(err)
	}
	var replay int64
	for _, c := range preview {
		replay += c.Replay
	}
	fmt.Println("a reset to earliest replays", replay, "events")

	if _, err := offsets.Reset(ctx, pool, "billing", pgevents.DefaultTopic, offsets.Start{Kind: offsets.Earliest}, false); err != nil {
		log.Fatal(err)
	}
	lag, _, err := offsets.Lag(ctx, pool, "billing", pgevents.DefaultTopic, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("lag after the reset:", lag)
	// Output:
	// a reset to earliest replays 3 events
	// lag after the reset: 3
}

// handleThree appends three events and runs a consumer of group until it
// has handled them.
func handleThree(ctx context.Context, pool *pgxpool.Pool, group string) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	handled := make(chan struct{}, 3)
	hs := &pgevents.Handlers{}
	hs.HandleFunc("invoice.paid", func(context.Context, pgx.Tx, *pgevents.Event) error {
		handled <- struct{}{}
		return nil
	})
	c, err := pgevents.NewConsumer(pool, pgevents.Config{GroupID: group, TotalPartitions: pgeventstest.DefaultPartitions, Handlers: hs})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for range 3 {
		if _, err := pgevents.Append(ctx, pool, pgevents.Event{HostID: "tenant-7", EventType: "invoice.paid"}); err != nil {
			log.Fatal(err)
		}
	}
	for range 3 {
		<-handled
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
}
