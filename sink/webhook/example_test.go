package webhook_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/sink/webhook"
)

// A consumer group that posts each trade event to a webhook, in order per
// host, up to 16 hosts at a time.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	relay, err := webhook.New(webhook.Options{URL: "https://hooks.example.com/trades", Concurrency: 16,
		Timeout: 5 * time.Second, Headers: map[string]string{"Authorization": "Bearer token"}})
	if err != nil {
		log.Fatal(err)
	}
	handlers := &pgevents.Handlers{}
	handlers.Handle("trade.booked", relay)
	c, err := pgevents.NewConsumer(pool, pgevents.Config{GroupID: "trade-webhook", TotalPartitions: 8, Handlers: handlers})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
