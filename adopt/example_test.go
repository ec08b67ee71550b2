package adopt_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/adopt"
	"github.com/pgevents/pgevents/schema"
)

// Moving a seed-style deployment onto pgevents, which `consumer migrate`
// installed in schema pgevents beside it: look first, then adopt.
func Example() {
	ctx := schema.WithName(context.Background(), "pgevents")
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

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
	fmt.Printf("%d events, %d groups, counter at %d\n", plan.Events, len(plan.Groups), plan.NextOffset)

	res, err := adopt.Adopt(ctx, pool, adopt.Options{Bridge: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("copied %d events in %s\n", res.Copied, res.Took)
}
