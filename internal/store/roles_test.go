package store

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// TestEndFrozenHolder: the holder of a role's key is ended only when it is
// frozen, for each role: its session is the role's (named
// "pgevents <role> <holder>"), no live replica of the topic has its name,
// and it has run no statement for the grace. A live replica's holder idle
// for long (a watcher asleep), a holder that is not a replica but runs
// statements (`consumer maintain`'s sequencer), a session busy in a
// statement and another application's session are all left alone; a
// waiter then gets the key.
func TestEndFrozenHolder(t *testing.T) {
	t.Parallel()
	ctx, url := setup(t, 1)
	pool := pgtest.Pool(t, url)
	const grace = 300 * time.Millisecond
	connect := func(app string) *pgx.Conn {
		t.Helper()
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = app
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	heartbeat := func(replica string, live bool) {
		t.Helper()
		expires := "clock_timestamp() + interval '1 hour'"
		if !live {
			expires = "clock_timestamp() - interval '1 second'"
		}
		if _, err := pool.Exec(ctx, `INSERT INTO consumer_replicas (group_id, topic_id, replica_id, mode, expires_at)
			VALUES ('g', 1, $1, 'auto', `+expires+`)
			ON CONFLICT (group_id, topic_id, replica_id) DO UPDATE SET expires_at = excluded.expires_at`, replica); err != nil {
			t.Fatal(err)
		}
	}
	for _, role := range []Role{RoleWatcher, RoleSequencer, RoleMaintenance} {
		waiter := connect("waiter")
		end := func(want string, why string) {
			t.Helper()
			got, err := EndFrozenHolder(ctx, waiter, role, 1, grace)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("%s: %s: ended %q, want %q", role, why, got, want)
			}
		}
		hold := func(c *pgx.Conn) {
			t.Helper()
			if ok, err := TryRole(ctx, c, role, 1); err != nil || !ok {
				t.Fatalf("%s: take the key: %v, %v", role, ok, err)
			}
		}
		idle := func() { time.Sleep(2 * grace) } // the state under test is "no statement for the grace"

		// A replica that heartbeats keeps the key, idle or not.
		replica := "r-" + role.String()
		app := role.ApplicationName(replica)
		holder := connect(app)
		heartbeat(replica, true)
		hold(holder)
		idle()
		end("", "the replica heartbeats")
		// Busy in a statement while its heartbeat has lapsed: left alone.
		heartbeat(replica, false)
		busy := make(chan error, 1)
		go func() {
			_, err := holder.Exec(ctx, `SELECT pg_sleep(1.5)`)
			busy <- err
		}()
		pgtest.WaitFor(t, 5*time.Second, "the holder's statement running", func() bool {
			var n int
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'`, app).Scan(&n)
			return n == 1
		})
		time.Sleep(2 * grace) // active for longer than the grace
		end("", "the holder runs a statement")
		if err := <-busy; err != nil {
			t.Fatal(err)
		}
		// Just finished its statement: not idle for the grace yet.
		end("", "the holder ran a statement within the grace")
		// Frozen: no heartbeat, no statement. Its session is ended, and a
		// waiter gets the key.
		idle()
		end(app, "the holder is frozen")
		if ok, err := WaitRole(ctx, waiter, role, 1, 5*time.Second); err != nil || !ok {
			t.Fatalf("%s: the waiter did not get the key after the frozen holder's session ended: %v, %v", role, ok, err)
		}
		if err := ReleaseRole(ctx, waiter, role, 1); err != nil {
			t.Fatal(err)
		}

		// A holder that is no replica (consumer maintain) is ended only
		// once it has run no statement for the grace.
		maint := connect(role.ApplicationName("maintain"))
		hold(maint)
		for range 4 {
			time.Sleep(grace / 2)
			if _, err := maint.Exec(ctx, `SELECT 1`); err != nil {
				t.Fatal(err)
			}
			end("", "the non-replica holder runs statements")
		}
		idle()
		end(role.ApplicationName("maintain"), "the non-replica holder is frozen")

		// Another application's session is never ended.
		other := connect("psql")
		pgtest.WaitFor(t, 5*time.Second, "the ended session gone", func() bool {
			ok, err := TryRole(ctx, other, role, 1)
			return err == nil && ok
		})
		idle()
		end("", "the holder is another application's session")
		waitedOut, err := WaitRole(ctx, waiter, role, 1, 50*time.Millisecond)
		if err != nil || waitedOut {
			t.Fatalf("%s: WaitRole on a held key: %v, %v; want false after its wait", role, waitedOut, err)
		}
		sessions, waiting, err := RoleSessions(ctx, pool, role, 1)
		if err != nil || sessions != "psql" || waiting != 0 {
			t.Fatalf("%s: RoleSessions: %q, %d, %v; want psql, 0", role, sessions, waiting, err)
		}
		if err := ReleaseRole(ctx, other, role, 1); err != nil {
			t.Fatal(err)
		}
	}
}
