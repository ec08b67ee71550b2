package kafka_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/sink/kafka"
)

// A consumer group that relays every event to Kafka, one topic per event
// type, each host's records in one Kafka partition.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	relay, err := kafka.New(kafka.Options{Brokers: []string{"kafka-1:9092"}, Topic: "portal.{event_type}"})
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
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
