package pgevents_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/pgeventstest"
)

// databaseURL is where the examples run: a fresh database from
// pgeventstest, migrated, with topic 1 of 8 partitions (`consumer migrate`
// makes the same). In an application it comes from the configuration.
func databaseURL() string { return pgeventstest.ExampleDB(nil) }

// Appending events inside the business transaction: they become visible,
// and are handled, only if the transaction commits.
func ExampleAppend() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id bigint PRIMARY KEY, email text);
		INSERT INTO accounts VALUES (42, 'ada@old.example')`); err != nil {
		log.Fatal(err)
	}

	var offsets []int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET email = $1 WHERE id = $2`, "ada@example.com", 42); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"id": 42, "email": "ada@example.com"})
		// Last in the transaction: the topic's append lock stays held
		// from here to commit.
		offsets, err = pgevents.Append(ctx, tx, pgevents.Event{
			HostID:    "tenant-7", // the partition key: one tenant's events stay in order
			UserID:    "42",
			EventType: "user.email_changed",
			Payload:   payload,
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("appended at offsets", offsets)
	// Output: appended at offsets [1]
}

// A consumer group with a handler compiled in. The handler's statements
// commit together with the group's offset: exactly once.
func ExampleConsumer() {
	ctx, stop := context.WithCancel(context.Background()) // in a service: signal.NotifyContext
	defer stop()
	url := databaseURL()

	pc, err := pgevents.ParsePoolConfig(url) // the consumer's session settings
	if err != nil {
		log.Fatal(err)
	}
	pc.MaxConns = int32(pgevents.PoolSize(8))
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE user_search (id bigint PRIMARY KEY, email text)`); err != nil {
		log.Fatal(err)
	}

	type emailChanged struct {
		ID    int64  `json:"id"`
		Email string `json:"email"`
	}
	handled := make(chan struct{}, 1)
	handlers := &pgevents.Handlers{}
	handlers.Handle("user.email_changed", pgevents.JSONHandler(
		func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event, p emailChanged) error {
			_, err := tx.Exec(ctx, `INSERT INTO user_search (id, email) VALUES ($1, $2)
				ON CONFLICT (id) DO UPDATE SET email = excluded.email`, p.ID, p.Email)
			select { // for the example: stop once handled
			case handled <- struct{}{}:
			default:
			}
			return err // a SQLSTATE 40001 is retried; a 23xxx dead-letters the event's unit
		}))

	c, err := pgevents.NewConsumer(pool, pgevents.Config{
		GroupID:         "user-search",
		TotalPartitions: 8,
		Handlers:        handlers,
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }() // until ctx ends; the batch in flight commits or rolls back

	if _, err := pgevents.Append(ctx, pool, pgevents.Event{HostID: "tenant-7", EventType: "user.email_changed",
		Payload: json.RawMessage(`{"id": 42, "email": "ada@example.com"}`)}); err != nil {
		log.Fatal(err)
	}
	<-handled
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	var email string
	if err := pool.QueryRow(context.Background(), `SELECT email FROM user_search WHERE id = 42`).Scan(&email); err != nil {
		log.Fatal(err)
	}
	fmt.Println("user 42:", email)
	// Output: user 42: ada@example.com
}

// An effect outside PostgreSQL, made idempotent with the event id and
// fenced with the lease epoch.
func ExampleEpoch() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	sent := make(chan map[string]any, 1)
	handlers := &pgevents.Handlers{}
	handlers.HandleFunc("invoice.paid", func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
		req := map[string]any{
			"idempotency_key": ev.EventID,         // the same on every redelivery
			"fencing_token":   pgevents.Epoch(tx), // refuse it if a higher one was seen for this partition
			"partition":       ev.PartitionID,
		}
		select { // send it to the other system; an error there is retried, then dead-lettered
		case sent <- req:
		default:
		}
		return nil
	})
	c, err := pgevents.NewConsumer(pool, pgevents.Config{GroupID: "billing", TotalPartitions: 8, Handlers: handlers})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	offsets, err := pgevents.Append(ctx, pool, pgevents.Event{HostID: "tenant-7", EventType: "invoice.paid"})
	if err != nil {
		log.Fatal(err)
	}
	req := <-sent
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	fmt.Println("offset", offsets[0], "fenced:", req["fencing_token"].(int64) > 0, "idempotency key set:", req["idempotency_key"] != "")
	// Output: offset 1 fenced: true idempotency key set: true
}
