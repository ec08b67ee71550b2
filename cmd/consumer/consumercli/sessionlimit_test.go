package consumercli

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgcluster"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// sessionStallBound is the longest a partition with pending events may go
// without a committed batch when one replica cannot get sessions: the
// bound after which its worker lets the partition go, plus the takeover
// (a heartbeat of the healthy replicas, the lease check) and a margin for
// a loaded machine.
const sessionStallBound = pgevents.SessionFailureBound + 4*time.Second

// TestReplicaWithoutSessions (issue 46, case 2): two healthy replicas
// share 8 partitions while producers append multi-event transactions over
// 100 hosts; then a third replica joins whose role has CONNECTION LIMIT 3,
// too few sessions for the partitions its share gives it. No partition with
// pending events goes longer than SessionFailureBound plus the takeover
// without a committed batch, and every event is handled once, in host
// order.
func TestReplicaWithoutSessions(t *testing.T) {
	dbURL, pool := migrated(t, 8)
	cfg := writeConfig(t, recordingConfig(8, -1, 20)+"leaseMs: 1000\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The third replica's role: every privilege the consumer needs, and 3
	// sessions.
	role := fmt.Sprintf("limited_%d", time.Now().UnixNano()%1e9)
	eventtest.Exec(t, pool, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'pw' CONNECTION LIMIT 3`, role))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE IF EXISTS %[1]s`, role))
	})
	var db, sch string
	if err := pool.QueryRow(ctx, `SELECT current_database(), current_schema()`).Scan(&db, &sch); err != nil {
		t.Fatal(err)
	}
	eventtest.Exec(t, pool, fmt.Sprintf(`GRANT ALL ON SCHEMA %[2]s TO %[1]s;
GRANT ALL ON ALL TABLES IN SCHEMA %[2]s TO %[1]s;
GRANT ALL ON ALL SEQUENCES IN SCHEMA %[2]s TO %[1]s;
GRANT pg_signal_backend TO %[1]s`, role, sch))
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "pw")
	limitedURL := u.String()

	procs := []*proc{start(t, dbURL, "run", "--config", cfg), start(t, dbURL, "run", "--config", cfg)}
	pgtest.WaitFor(t, 15*time.Second, "8 partitions owned", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_ownership WHERE live`) == 8
	})

	mon := &stallMonitor{}
	monDone := make(chan struct{})
	go func() { defer close(monDone); mon.run(ctx, t, pool) }()

	seed := uint64(time.Now().UnixNano())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("producer seed %d", seed)
		}
	})
	stopProducing := make(chan struct{})
	time.AfterFunc(30*time.Second, func() { close(stopProducing) })
	committed := produceMixed(t, pool, seed, 2, 0, stopProducing)

	// The third replica joins after 3 s of traffic.
	select {
	case <-stopProducing:
	case <-time.After(3 * time.Second):
	}
	third := start(t, limitedURL, "run", "--config", cfg)
	n := committed()
	if t.Failed() {
		return
	}
	eventtest.WaitHandled(t, pool, n, 60*time.Second)
	cancel()
	<-monDone
	eventtest.CheckHandled(t, pool)
	t.Logf("%d events; longest stall of a partition with pending events %s (%s); longest without a live owner %s",
		n, mon.maxStall, mon.worst, mon.maxOwnerless)
	if mon.maxStall > sessionStallBound {
		t.Errorf("a partition with pending events went %s without a committed batch (%s); the bound is %s",
			mon.maxStall, mon.worst, sessionStallBound)
	}
	select {
	case code := <-third.exitCh:
		t.Errorf("the replica without sessions exited with %d", code)
	default:
	}
	for _, p := range procs {
		if code := p.stop(t, 15*time.Second); code != 0 {
			t.Errorf("replica exited with %d after SIGTERM", code)
		}
	}
}

// TestMoreProcessesThanConnections (issue 46, case 2): more `consumer
// run` processes than a server of max_connections 20 has sessions for.
// The processes that get sessions serve every partition, no partition with
// pending events stalls beyond SessionFailureBound plus the takeover, and
// each process that cannot connect stays up, waiting with back-off, and
// says so in its log instead of exiting.
func TestMoreProcessesThanConnections(t *testing.T) {
	dir := t.TempDir()
	cl, err := pgcluster.Start(t.Context(), pgcluster.Options{Dir: dir, Relocate: true,
		Settings: map[string]string{"max_connections": "20", "superuser_reserved_connections": "3", "fsync": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Stop() })
	admin := pgtest.Pool(t, cl.URL("postgres"))
	eventtest.Exec(t, admin, `CREATE DATABASE app`)
	admin.Close()
	dbURL := cl.URL("app")
	cfg := writeConfig(t, recordingConfig(4, -1, 20)+"leaseMs: 1000\n")
	if code, out := runOnce(t, dbURL, "migrate", "--config", cfg); code != 0 {
		t.Fatalf("consumer migrate: exit %d\n%s", code, out)
	}
	// The test's own sessions, taken before the processes take the rest.
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns, pc.MinConns = 3, 3
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	eventtest.Exec(t, pool, eventtest.HandledTable)
	pgtest.WaitFor(t, 10*time.Second, "the test's 3 sessions", func() bool { return pool.Stat().TotalConns() == 3 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	procs := make([]*proc, 3)
	for i := range procs {
		procs[i] = start(t, dbURL, "run", "--config", cfg)
	}
	pgtest.WaitFor(t, 30*time.Second, "4 partitions owned", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_ownership WHERE live`) == 4
	})
	// Take the server's remaining sessions, start 3 more processes, which
	// cannot connect, and give the sessions back while events flow.
	var filler []*pgx.Conn
	for range 30 {
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			break
		}
		filler = append(filler, conn)
	}
	t.Logf("the test took the %d remaining sessions", len(filler))
	for range 3 {
		procs = append(procs, start(t, dbURL, "run", "--config", cfg))
	}
	for i, p := range procs[3:] {
		pgtest.WaitFor(t, 20*time.Second, fmt.Sprintf("extra process %d logs that it waits", i), func() bool {
			select {
			case code := <-p.exitCh:
				t.Fatalf("extra process %d exited with %d instead of waiting for a session:\n%s", i, code, tail(p.out.String(), 1500))
			default:
			}
			// It waits at start, or, when a slot freed by another
			// process's idle session let its first connect through, in
			// the loop that starts its layout: either backs off and says
			// so.
			out := p.out.String()
			return strings.Contains(out, startWaitMsg) || strings.Contains(out, "could not start consuming the group's layout")
		})
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
		for _, c := range filler {
			_ = c.Close(context.Background())
		}
	}()
	mon := &stallMonitor{}
	monDone := make(chan struct{})
	go func() { defer close(monDone); mon.run(ctx, t, pool) }()

	seed := uint64(time.Now().UnixNano())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("producer seed %d", seed)
		}
	})
	stopProducing := make(chan struct{})
	time.AfterFunc(20*time.Second, func() { close(stopProducing) })
	committed := produceMixed(t, pool, seed, 1, 0, stopProducing)()
	if t.Failed() {
		return
	}
	eventtest.WaitHandled(t, pool, committed, 60*time.Second)
	cancel()
	<-monDone
	eventtest.CheckHandled(t, pool)
	waiting := 0
	for i, p := range procs {
		select {
		case code := <-p.exitCh:
			t.Errorf("process %d exited with %d:\n%s", i, code, tail(p.out.String(), 2000))
			continue
		default:
		}
		if strings.Contains(p.out.String(), startWaitMsg) {
			waiting++
		}
	}
	t.Logf("%d events; %d of %d processes waited for a session at start; longest stall of a partition with pending events %s (%s)",
		committed, waiting, len(procs), mon.maxStall, mon.worst)
	if waiting == 0 {
		t.Errorf("no process logged %q: the server had sessions for all", startWaitMsg)
	}
	if mon.maxStall > sessionStallBound {
		t.Errorf("a partition with pending events went %s without a committed batch (%s); the bound is %s",
			mon.maxStall, mon.worst, sessionStallBound)
	}
}
