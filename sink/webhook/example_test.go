package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/pgeventstest"
	"github.com/pgevents/pgevents/sink/webhook"
)

// A consumer group that posts each trade event to a webhook, in order per
// host, up to 16 hosts at a time; here to an endpoint of the example's own
// (httptest).
func Example() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	received := make(chan string, 1)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev pgevents.Event // the body is the event as JSON
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest) // permanent: the event's unit is dead-lettered
			return
		}
		select {
		case received <- fmt.Sprintf("%s %s: %s for %s %s, deduplicate on the Idempotency-Key: %v", r.Method, r.URL.Path,
			ev.EventType, ev.HostID, ev.Payload, r.Header.Get("Idempotency-Key") == ev.EventID):
		default:
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer endpoint.Close()
	pool, err := pgxpool.New(ctx, pgeventstest.ExampleDB(nil)) // migrated, topic 1 of 8 partitions
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	relay, err := webhook.New(webhook.Options{URL: endpoint.URL + "/trades", Concurrency: 16,
		Timeout: 5 * time.Second, Headers: map[string]string{"Authorization": "Bearer token"}})
	if err != nil {
		log.Fatal(err)
	}
	defer relay.Close() // after the consumer stopped
	handlers := &pgevents.Handlers{}
	handlers.Handle("trade.booked", relay)
	c, err := pgevents.NewConsumer(pool, pgevents.Config{GroupID: "trade-webhook", TotalPartitions: 8, Handlers: handlers})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	if _, err := pgevents.Append(ctx, pool, pgevents.Event{HostID: "desk-3", EventType: "trade.booked",
		Payload: json.RawMessage(`{"qty": 100}`)}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-received)
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output: POST /trades: trade.booked for desk-3 {"qty":100}, deduplicate on the Idempotency-Key: true
}
