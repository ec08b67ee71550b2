package kafkasink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/pgeventstest"
	"github.com/pgevents/pgevents/sink/kafkasink"
)

// A consumer group that relays every event to Kafka, one topic per event
// type, each host's records in one Kafka partition; here to an in-process
// broker (kfake), read back as another service would.
func Example() {
	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	broker, err := kfake.NewCluster(kfake.SeedTopics(1, "portal.order.placed")) // in production: your brokers
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	pool, err := pgxpool.New(ctx, pgeventstest.ExampleDB(nil)) // migrated, topic 1 of 8 partitions
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	relay, err := kafkasink.New(kafkasink.Options{Brokers: broker.ListenAddrs(), Topic: "portal.{event_type}"})
	if err != nil {
		log.Fatal(err)
	}
	defer relay.Close() // after the consumer stopped
	handlers := &pgevents.Handlers{}
	handlers.HandleAll(relay)
	c, err := pgevents.NewConsumer(pool, pgevents.Config{GroupID: "kafka-relay", TotalPartitions: 8, Handlers: handlers})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	if _, err := pgevents.Append(ctx, pool, pgevents.Event{HostID: "tenant-7", EventType: "order.placed",
		Payload: json.RawMessage(`{"order_id": 42}`)}); err != nil {
		log.Fatal(err)
	}
	reader, err := kgo.NewClient(kgo.SeedBrokers(broker.ListenAddrs()...), kgo.ConsumeTopics("portal.order.placed"))
	if err != nil {
		log.Fatal(err)
	}
	defer reader.Close()
	rec := reader.PollFetches(ctx).Records()[0]
	headers := map[string]string{}
	for _, h := range rec.Headers {
		headers[h.Key] = string(h.Value)
	}
	fmt.Printf("%s: key %s, value %s, event_type %s, event_id set: %v\n",
		rec.Topic, rec.Key, rec.Value, headers["event_type"], headers["event_id"] != "")
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output: portal.order.placed: key tenant-7, value {"order_id": 42}, event_type order.placed, event_id set: true
}
