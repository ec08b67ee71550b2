package offsets_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/pgeventstest"
)

func TestMain(m *testing.M) { pgeventstest.Main(m) }

// TestOperatorAPI: positions and lag follow a reset, the preview changes
// nothing, and the lifecycle refuses a transition it does not allow.
func TestOperatorAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgeventstest.NewPool(t, pgeventstest.NewDB(t, nil))
	handleThree(ctx, pool, "g")
	topic := pgevents.DefaultTopic

	ps, err := offsets.Positions(ctx, pool, "g", topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != pgeventstest.DefaultPartitions {
		t.Fatalf("%d positions, want %d", len(ps), pgeventstest.DefaultPartitions)
	}
	var ends int64
	for _, p := range ps {
		if p.Next < 0 || p.Lag != 0 || p.LagCapped {
			t.Errorf("partition %d after handling everything: %+v", p.Partition, p)
		}
		ends += p.LogEnd
	}
	if ends != 3 { // the topic's offsets are 1, 2, 3, all in tenant-7's partition
		t.Errorf("log ends sum to %d, want 3", ends)
	}

	before, _ := offsets.Positions(ctx, pool, "g", topic, 0)
	counted, err := offsets.Preview(ctx, pool, "g", topic, offsets.Start{Kind: offsets.AtOffset, Offset: 2}, false)
	if err != nil {
		t.Fatal(err)
	}
	var replay int64
	for _, c := range counted {
		replay += c.Replay
	}
	if replay != 2 {
		t.Errorf("the preview of a reset to offset 2 replays %d events, want 2: %+v", replay, counted)
	}
	after, _ := offsets.Positions(ctx, pool, "g", topic, 0)
	for i := range before {
		if before[i].Next != after[i].Next {
			t.Errorf("the preview moved partition %d: %d -> %d", i, before[i].Next, after[i].Next)
		}
	}
	if _, err := offsets.Reset(ctx, pool, "g", topic, offsets.Start{Kind: offsets.AtOffset, Offset: 2}, false); err != nil {
		t.Fatal(err)
	}
	if lag, capped, err := offsets.Lag(ctx, pool, "g", topic, 1); err != nil || lag != 1 || !capped {
		t.Errorf("lag capped at 1 = %d, %v, %v; want 1, true", lag, capped, err)
	}

	if prev, err := offsets.Pause(ctx, pool, "g", topic); err != nil || prev != offsets.Active {
		t.Fatalf("pause: %q, %v", prev, err)
	}
	if st, err := offsets.State(ctx, pool, "g", topic); err != nil || st != offsets.Paused {
		t.Errorf("state after pause: %q, %v", st, err)
	}
	if _, err := offsets.Resume(ctx, pool, "g", topic); err != nil {
		t.Fatal(err)
	}
	if _, err := offsets.Resume(ctx, pool, "g", topic); !errors.Is(err, offsets.ErrTransition) {
		t.Errorf("resuming an active group: %v, want ErrTransition", err)
	}
	if hs, err := offsets.Halts(ctx, pool, "g", topic); err != nil || len(hs) != 0 {
		t.Errorf("halts: %v, %v", hs, err)
	}
}
