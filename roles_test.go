package pgevents

import (
	"context"
	"testing"
	"time"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// TestMaintenanceTakenOverFromFrozenHolder: a process frozen in the middle
// of a maintenance pass keeps its session, and with it the topic's
// maintenance key. Another process's pass skips while the holder runs
// statements, and once the holder has run none for roleGrace (and is no
// replica with a live heartbeat), it ends the holder's session and runs
// the pass. Its session is back in the pool under its own name, without
// the key.
func TestMaintenanceTakenOverFromFrozenHolder(t *testing.T) {
	t.Parallel()
	pool := pgtest.TopicPool(t, 2)
	ctx := pgtest.Context(context.Background())
	holder, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	// As `consumer maintain` holds it (store.RoleMaintenance).
	var ok bool
	if err := holder.QueryRow(ctx, `SELECT set_config('application_name', 'pgevents maintenance maintain', false) IS NOT NULL
		AND pg_try_advisory_lock(lock_key('maintenance', '1'))`).Scan(&ok); err != nil || !ok {
		t.Fatalf("take the maintenance key: %v, %v", ok, err)
	}
	// The holder just ran a statement: it is maintaining.
	m, err := Maintain(ctx, pool, 1, nil)
	if err != nil || m.Ran {
		t.Fatalf("Maintain beside a live holder: %+v, %v; want a skipped pass", m, err)
	}
	// No statement for longer than roleGrace: frozen.
	time.Sleep(2500 * time.Millisecond) // roleGrace, and more: the property is time without a statement
	if m, err = Maintain(ctx, pool, 1, nil); err != nil || !m.Ran {
		t.Fatalf("Maintain beside a frozen holder: %+v, %v; want the pass run", m, err)
	}
	if _, err := holder.Exec(ctx, `SELECT 1`); err == nil {
		t.Fatal("the frozen holder's session still runs statements")
	}
	// A backend whose session was ended or closed leaves pg_stat_activity
	// (and releases its locks) as it exits, a moment after its client saw
	// the connection close: both are polled until they are gone.
	pgtest.WaitFor(t, 10*time.Second, "no session named for maintenance after the pass", func() bool {
		n := queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgevents maintenance %'`)
		return n == 0
	})
	pgtest.WaitFor(t, 10*time.Second, "the maintenance key released after the pass", func() bool {
		n := heldKey(t, pool, "maintenance", "1", "")
		return n == 0
	})
}
