package pgevents_test

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents"
)

// Appending events inside the business transaction: they become visible,
// and are handled, only if the transaction commits.
func ExampleAppend() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET email = $1 WHERE id = $2`, "ada@example.com", 42); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"id": 42, "email": "ada@example.com"})
		// Last in the transaction: the topic's counter row stays locked
		// from here to commit.
		_, err := pgevents.Append(ctx, tx, pgevents.Event{
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
}

// A consumer group with a handler compiled in. The handler's statements
// commit together with the group's offset: exactly once.
func ExampleConsumer() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pc, err := pgevents.ParsePoolConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	pc.MaxConns = int32(pgevents.PoolSize(8))
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	type emailChanged struct {
		ID    int64  `json:"id"`
		Email string `json:"email"`
	}
	handlers := &pgevents.Handlers{}
	handlers.Handle("user.email_changed", pgevents.JSONHandler(
		func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event, p emailChanged) error {
			_, err := tx.Exec(ctx, `INSERT INTO user_search (id, email) VALUES ($1, $2)
				ON CONFLICT (id) DO UPDATE SET email = excluded.email`, p.ID, p.Email)
			return err // a SQLSTATE 40001 is retried; a 23xxx dead-letters the event's unit
		}))

	logger := zerolog.New(os.Stderr).With().Timestamp().Logger()
	c, err := pgevents.NewConsumer(pool, pgevents.Config{
		GroupID:         "user-search",
		TotalPartitions: 8,
		Handlers:        handlers,
		Logger:          &logger,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until SIGINT; the batch in flight commits or rolls back
		log.Fatal(err)
	}
}

// An effect outside PostgreSQL, made idempotent with the event id and
// fenced with the lease epoch.
func ExampleEpoch() {
	handlers := &pgevents.Handlers{}
	handlers.HandleFunc("invoice.paid", func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
		req := map[string]any{
			"idempotency_key": ev.EventID,         // the same on every redelivery
			"fencing_token":   pgevents.Epoch(tx), // refuse it if a higher one was seen for this partition
			"partition":       ev.PartitionID,
		}
		_ = req // send it to the other system; an error there is retried, then dead-lettered
		return nil
	})
}
