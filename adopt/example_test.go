package adopt_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/adopt"
	"github.com/pgevents/pgevents/pgeventstest"
	"github.com/pgevents/pgevents/schema"
)

// seedDeployment is a deployment of the seed design, as the example finds
// it in public: three events, and group billing at offset 2 in each of its
// four partitions (it handled the first event).
const seedDeployment = `
CREATE TABLE log_counter (id int PRIMARY KEY, next_offset bigint NOT NULL DEFAULT 1);
INSERT INTO log_counter VALUES (1, 4);
CREATE TABLE outbox_message_t (
    id uuid PRIMARY KEY, host_id uuid NOT NULL, user_id uuid, event_type varchar(255) NOT NULL,
    payload jsonb NOT NULL, transaction_id uuid, created_dt timestamptz NOT NULL DEFAULT now(), c_offset bigint UNIQUE);
INSERT INTO outbox_message_t (id, host_id, event_type, payload, c_offset)
    SELECT gen_random_uuid(), gen_random_uuid(), 'invoice.paid', '{}', n FROM generate_series(1, 3) n;
CREATE TABLE consumer_offsets (
    group_id varchar(255), topic_id int, partition_id int, next_offset bigint NOT NULL DEFAULT 1,
    PRIMARY KEY (group_id, topic_id, partition_id));
INSERT INTO consumer_offsets SELECT 'billing', 1, p, 2 FROM generate_series(0, 3) p;`

// Moving a seed-style deployment onto pgevents, which `consumer migrate`
// installed in schema pgevents beside it: look first, then adopt.
func Example() {
	// A database with pgevents in schema pgevents and no topic yet, and
	// the seed deployment in public.
	url := pgeventstest.ExampleDB(&pgeventstest.DBOptions{Schema: "pgevents", NoTopic: true})
	ctx := schema.WithName(context.Background(), "pgevents")
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, seedDeployment); err != nil {
		log.Fatal(err)
	}

	plan, err := adopt.Inspect(ctx, pool, adopt.Options{Bridge: true})
	var unknown *adopt.PartitionsUnknownError
	if errors.As(err, &unknown) {
		log.Fatal(err) // set Options.Partitions to the old consumers' totalPartitions
	}
	if err != nil {
		log.Fatal(err)
	}
	if len(plan.Problems) > 0 {
		log.Fatalf("adopt would refuse: %v", plan.Problems)
	}
	fmt.Printf("%d events, %d groups, %d partitions (read from %s), counter at %d\n",
		plan.Events, len(plan.Groups), plan.Options.Partitions, plan.PartitionsFrom, plan.NextOffset)

	res, err := adopt.Adopt(ctx, pool, adopt.Options{Bridge: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("copied %d events\n", res.Copied)
	topic, err := schema.LookupTopic(ctx, pool, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("topic %d: %d partitions, next offset %d\n", topic.ID, topic.Partitions, topic.NextOffset)
	// Output:
	// 3 events, 1 groups, 4 partitions (read from "public"."consumer_offsets"), counter at 4
	// copied 3 events
	// topic 1: 4 partitions, next offset 4
}
