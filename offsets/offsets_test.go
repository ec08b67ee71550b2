package offsets_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/pgeventstest"
)

func TestMain(m *testing.M) { pgeventstest.Main(m) }

// TestOperatorAPI: positions and lag follow a reset, the preview changes
// nothing, and a group without a subscription is refused without naming a
// package.
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
	if _, err := offsets.Cancel(ctx, pool, "other", topic); err == nil || strings.Contains(err.Error(), "offsets:") {
		t.Errorf("cancelling a group without a subscription: %v, want an error without a package name", err)
	}
	if hs, err := offsets.Halts(ctx, pool, "g", topic); err != nil || len(hs) != 0 {
		t.Errorf("halts: %v, %v", hs, err)
	}
}

// TestPauseResumeIdempotent: pausing a paused group and resuming an active
// one succeed and change nothing (the state returned says the group was in
// it already); a transition the lifecycle does not allow (resuming a
// cancelled group) is ErrTransition, whose message names no package.
func TestPauseResumeIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgeventstest.NewPool(t, pgeventstest.NewDB(t, nil))
	handleThree(ctx, pool, "g")
	topic := pgevents.DefaultTopic
	changedAt := func() time.Time {
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT state_changed_at FROM subscriptions WHERE group_id = 'g'`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}

	if prev, err := offsets.Resume(ctx, pool, "g", topic); err != nil || prev != offsets.Active {
		t.Fatalf("resuming an active group: %q, %v; want %q and no error", prev, err, offsets.Active)
	}
	if prev, err := offsets.Pause(ctx, pool, "g", topic); err != nil || prev != offsets.Active {
		t.Fatalf("pause: %q, %v", prev, err)
	}
	paused := changedAt()
	if prev, err := offsets.Pause(ctx, pool, "g", topic); err != nil || prev != offsets.Paused {
		t.Fatalf("pausing a paused group: %q, %v; want %q and no error", prev, err, offsets.Paused)
	}
	if st, _ := offsets.State(ctx, pool, "g", topic); st != offsets.Paused || !changedAt().Equal(paused) {
		t.Errorf("pausing a paused group changed it: %s since %v, was paused at %v", st, changedAt(), paused)
	}
	if _, err := offsets.Cancel(ctx, pool, "g", topic); err != nil {
		t.Fatal(err)
	}
	_, err := offsets.Resume(ctx, pool, "g", topic)
	if !errors.Is(err, offsets.ErrTransition) || err.Error() != "invalid subscription transition: CANCELLED -> ACTIVE" {
		t.Errorf("resuming a cancelled group: %v, want ErrTransition saying CANCELLED -> ACTIVE", err)
	}
}

// TestAudit: Audit writes one row of console_audit with every field, its
// origin among them; the rows of the console, written before the origin
// column, are the console's; an entry without an origin is refused.
func TestAudit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgeventstest.NewPool(t, pgeventstest.NewDB(t, nil))
	topic, group, partition, dl := 1, "g", 3, int64(42)
	if err := offsets.Audit(ctx, pool, offsets.AuditEntry{Origin: offsets.OriginCLI, Actor: "ada@box", Action: "discard",
		Topic: &topic, Group: &group, Partition: &partition, DeadLetter: &dl, Detail: "offsets 1-2", Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	if err := offsets.Audit(ctx, pool, offsets.AuditEntry{Origin: offsets.OriginConsole, Actor: "bob", Remote: "10.0.0.1", Action: "pause",
		Topic: &topic, Group: &group, Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO console_audit (actor, remote, action, outcome) VALUES ('eve', '10.0.0.2', 'resume', 'ok')`); err != nil {
		t.Fatal(err)
	}
	rows, _ := pool.Query(ctx, `SELECT concat_ws(' ', origin, actor, remote, action, topic_id, group_id, partition_id, dead_letter_id, detail, outcome)
		FROM console_audit ORDER BY id`)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"cli ada@box  discard 1 g 3 42 offsets 1-2 ok", "console bob 10.0.0.1 pause 1 g  ok", "console eve 10.0.0.2 resume  ok"}
	if !slices.Equal(got, want) {
		t.Errorf("audit rows:\n%q\nwant\n%q", got, want)
	}
	if err := offsets.Audit(ctx, pool, offsets.AuditEntry{Action: "pause"}); err == nil {
		t.Error("an entry without an origin was recorded")
	}
}
