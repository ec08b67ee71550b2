package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/partition"
	"github.com/pgevents/pgevents/pgeventstest"
)

func TestMain(m *testing.M) { pgeventstest.Main(m) }

// TestOwners: once a consumer runs, every partition of its group has a live
// owner, the consumer's replica, with an epoch and an expiry ahead.
func TestOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgeventstest.NewDB(t, nil)
	pool := pgeventstest.NewPool(t, url)
	if owners, err := partition.Owners(ctx, pool, "g", pgevents.DefaultTopic); err != nil || len(owners) != 0 {
		t.Fatalf("owners before the group started: %v, %v", owners, err)
	}
	hs := &pgevents.Handlers{}
	hs.HandleFunc("nothing", func(context.Context, pgx.Tx, *pgevents.Event) error { return nil })
	pgeventstest.StartConsumer(t, url, pgevents.Config{GroupID: "g", TotalPartitions: pgeventstest.DefaultPartitions, Handlers: hs})
	var owners []partition.Owner
	pgeventstest.WaitFor(t, 10*time.Second, "every partition owned", func() bool {
		var err error
		if owners, err = partition.Owners(ctx, pool, "g", pgevents.DefaultTopic); err != nil {
			t.Fatal(err)
		}
		live := 0
		for _, o := range owners {
			if o.Live {
				live++
			}
		}
		return live == pgeventstest.DefaultPartitions
	})
	for i, o := range owners {
		if o.Partition != i || o.Replica == "" || o.Epoch < 1 || o.Expires.IsZero() || !o.Expires.After(o.Heartbeat) {
			t.Errorf("owner of partition %d: %+v", i, o)
		}
		if o.Replica != owners[0].Replica {
			t.Errorf("partition %d owned by %q, partition 0 by %q: one replica runs", i, o.Replica, owners[0].Replica)
		}
	}
}
