package consumercli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// built is a set of binaries built once per test run, into one
// directory.
type built struct {
	once sync.Once
	dir  string
	err  error
}

// build builds each package of bins (binary name → package, relative to
// this directory) the first time it is called, and returns the directory.
func (b *built) build(t *testing.T, bins map[string]string) string {
	t.Helper()
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "pgevents-bin-"); b.err != nil {
			return
		}
		for bin, pkg := range bins {
			if out, err := exec.Command("go", "build", "-o", filepath.Join(b.dir, bin), pkg).CombinedOutput(); err != nil {
				b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.dir
}

var consumerBinaries built

// binary builds the consumer binary once per test run and returns its path.
// The development binary is built next to it, to which it hands demo and
// bench.
func binary(t *testing.T) string {
	t.Helper()
	return filepath.Join(consumerBinaries.build(t, map[string]string{"consumer": "..", DevBinary: "../../consumer-dev"}), "consumer")
}

// proc is a consumer process started by a test.
type proc struct {
	cmd    *exec.Cmd
	out    *logtest.Buffer // its stdout and stderr; its log lines checked
	done   chan struct{}
	exitCh chan int
}

// start runs the consumer binary with args and DATABASE_URL=url; the
// process is killed when the test ends if it is still running.
func start(t *testing.T, url string, args ...string) *proc {
	t.Helper()
	return startBinary(t, binary(t), url, args...)
}

// startBinary is start of the binary at path.
func startBinary(t *testing.T, path, url string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	p := &proc{cmd: cmd, out: logtest.New(t), done: make(chan struct{}), exitCh: make(chan int, 1)}
	cmd.Stdout = p.out
	cmd.Stderr = p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		p.exitCh <- cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("output of %v:\n%s", args, tail(p.out.String(), 3000))
		}
	})
	return p
}

// freeze stops p with SIGSTOP and waits until every thread of it is
// stopped. kill(2) only makes the stop pending: on a loaded machine a
// thread of the consumer went on for milliseconds after it returned, read
// the answer of the statement its batch waited on and committed the batch,
// and TestFencingFrozenInsideHandler blamed the fencing (3 runs in 15 under
// load). Only a process whose threads are all stopped is frozen.
func (p *proc) freeze(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	pid := p.cmd.Process.Pid
	pgtest.WaitFor(t, 10*time.Second, fmt.Sprintf("every thread of process %d stopped", pid), func() bool {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil || len(tasks) == 0 {
			return false
		}
		for _, task := range tasks {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			// The state follows the command's name, which is in parentheses.
			i := bytes.LastIndexByte(stat, ')')
			if err != nil || i < 0 || i+2 >= len(stat) || (stat[i+2] != 'T' && stat[i+2] != 't') {
				return false
			}
		}
		return true
	})
}

// stop sends SIGTERM and returns the exit status, failing the test if the
// process does not exit within timeout.
func (p *proc) stop(t *testing.T, timeout time.Duration) int {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case code := <-p.exitCh:
		return code
	case <-time.After(timeout):
		t.Fatalf("process did not exit within %s of SIGTERM", timeout)
		return -1
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// writeConfig writes a configuration file and returns its path.
func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "db-event-consumer.yml")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runOnce runs the binary to completion and returns its exit status and
// output.
func runOnce(t *testing.T, url string, args ...string) (int, string) {
	t.Helper()
	return runBinary(t, binary(t), url, args...)
}

// runBinary is runOnce of the binary at path.
func runBinary(t *testing.T, path, url string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	out, _ := cmd.CombinedOutput()
	for _, line := range bytes.Split(out, []byte("\n")) {
		for _, p := range logtest.Check(line) {
			t.Errorf("logtest: %s in log line %s", p, line)
		}
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// recordingConfig is a configuration with the recording SQL handler, for
// a topic in the offset scope the tests run in (pgtest.Scope).
func recordingConfig(partitions, partitionID, batchSize int) string {
	return fmt.Sprintf(`groupId: g
batchSize: %d
totalPartitions: %d
partitionId: %d
offsetScope: %s
waitPeriodMs: 1000
logLevel: warn
handlers:
  - eventType: "*"
    type: sql
    statement: %q
`, batchSize, partitions, partitionID, pgtest.Scope(), strings.Join(strings.Fields(eventtest.RecordSQL), " "))
}

// migrated returns a fresh database URL with the schema and topic created
// by `consumer migrate`, the handled table, and a pool on it.
func migrated(t *testing.T, partitions int) (string, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.NewDB(t)
	cfg := writeConfig(t, recordingConfig(partitions, -1, 10))
	if code, out := runOnce(t, url, "migrate", "--config", cfg); code != 0 {
		t.Fatalf("consumer migrate: exit %d\n%s", code, out)
	}
	pool := pgtest.Pool(t, url)
	eventtest.Exec(t, pool, eventtest.HandledTable)
	return url, pool
}

// TestEightProcessesEightPartitions is the core acceptance test: 8
// concurrent producers append 20,000 events over 200 hosts in transactions
// of 1-50 events, some rolled back, plus single-host transactions of 35
// events; 8 consumer processes serve one partition each with batchSize 10.
// Every committed event is handled exactly once, no rolled-back one is,
// per-host order holds, and each producer transaction's slice of a
// partition is handled in one consumer transaction.
func TestEightProcessesEightPartitions(t *testing.T) {
	url, pool := migrated(t, 8)
	var procs []*proc
	for p := range 8 {
		cfg := writeConfig(t, recordingConfig(8, p, 10))
		procs = append(procs, start(t, url, "run", "--config", cfg))
	}

	ctx := context.Background()
	var committed, appended atomic.Int64
	var wg sync.WaitGroup
	const producers, target = 8, 20000
	for i := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			for k := 0; appended.Load() < target; k++ {
				var evs []pgevents.Event
				if k%10 == 9 {
					host := fmt.Sprintf("host-%d", rng.IntN(200))
					for range 35 {
						evs = append(evs, pgevents.Event{HostID: host, UserID: "u1", EventType: "big", Payload: []byte(`{}`)})
					}
				} else {
					for range 1 + rng.IntN(50) {
						evs = append(evs, pgevents.Event{HostID: fmt.Sprintf("host-%d", rng.IntN(200)),
							UserID: fmt.Sprintf("u%d", rng.IntN(3)), EventType: "t", Payload: []byte(`{"k":1}`)})
					}
				}
				rollback := rng.IntN(10) == 0
				err := func() error {
					tx, err := pool.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx) //nolint:errcheck
					if _, err := pgevents.Append(ctx, tx, evs...); err != nil {
						return err
					}
					if rollback {
						return tx.Rollback(ctx)
					}
					return tx.Commit(ctx)
				}()
				if err != nil {
					t.Error(err)
					return
				}
				appended.Add(int64(len(evs)))
				if !rollback {
					committed.Add(int64(len(evs)))
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	eventtest.WaitHandled(t, pool, committed.Load(), 3*time.Minute)
	eventtest.CheckHandled(t, pool)
	// Transactions larger than batchSize were among them.
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM (SELECT 1 FROM handled GROUP BY transaction_id, partition_id
		HAVING count(*) > 10) x`); n == 0 {
		t.Fatal("no producer transaction larger than batchSize reached a partition; the test proves nothing about extension")
	}
	t.Logf("%d events appended, %d committed and handled", appended.Load(), committed.Load())
	for _, p := range procs {
		if code := p.stop(t, 15*time.Second); code != 0 {
			t.Errorf("consumer exited with %d after SIGTERM, want 0", code)
		}
	}
}

// TestKillNineInsideHandler kills a consumer whose handler is blocked in the
// middle of a batch, then restarts it: nothing is lost, no effect doubles.
func TestKillNineInsideHandler(t *testing.T) {
	url, pool := migrated(t, 4)
	ctx := context.Background()
	eventtest.Exec(t, pool, `CREATE FUNCTION record_or_block(p_offset bigint, p_host text, p_partition int, p_tx bigint)
		RETURNS void LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO handled (c_offset, host_id, partition_id, transaction_id) VALUES (p_offset, p_host, p_partition, p_tx);
			IF p_host = 'blocker' THEN
				PERFORM pg_advisory_xact_lock_shared(4242);
			END IF;
		END $$`)
	cfg := writeConfig(t, strings.Replace(recordingConfig(4, -1, 10), strings.Join(strings.Fields(eventtest.RecordSQL), " "),
		"SELECT record_or_block(@c_offset, @host_id, @partition_id, @transaction_id)", 1))

	// The test holds the lock the handler will wait for.
	holder, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}

	p := start(t, url, "run", "--config", cfg)
	var total int64
	appendTx := func(evs ...pgevents.Event) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := pgevents.Append(ctx, tx, evs...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		total += int64(len(evs))
	}
	e := func(host string) pgevents.Event {
		return pgevents.Event{HostID: host, EventType: "t", Payload: []byte(`{}`)}
	}
	for i := range 20 {
		appendTx(e(fmt.Sprintf("h%d", i)))
	}
	// The blocker's unit: two events handled before the one that blocks.
	appendTx(e("blocker"), e("blocker"), e("blocker"))
	for i := range 20 {
		appendTx(e(fmt.Sprintf("h%d", i)))
	}
	pgtest.WaitFor(t, 20*time.Second, "handler blocked on the advisory lock", func() bool {
		// Waiting for lock 4242 itself, not for an advisory lock of the
		// consumer's own (an append in flight, a partition's append lock).
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = 0 AND objid = 4242 AND objsubid = 1
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 1
	})
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
		t.Fatal(err)
	}
	// The killed process's transaction is gone with its connection.
	pgtest.WaitFor(t, 10*time.Second, "the killed consumer's backends gone", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name LIKE 'pgevents-%'`) == 0
	})
	start(t, url, "run", "--config", cfg)
	eventtest.WaitHandled(t, pool, total, 60*time.Second)
	eventtest.CheckHandled(t, pool)
}

// TestInvalidConfigExitsTwo: each invalid configuration exits with status
// 2 and names the key.
func TestInvalidConfigExitsTwo(t *testing.T) {
	url, _ := migrated(t, 8)
	base := "groupId: g\ntotalPartitions: 8\nhandlers:\n  - eventType: \"*\"\n    type: log\n"
	twoHandlers := "groupId: g\ntotalPartitions: 8\nhandlers:\n" +
		"  - {eventType: order.placed, type: sql, statement: SELECT 1}\n  - {eventType: order.placed, type: sql, statement: SELECT 2}\n"
	cases := []struct {
		name, yaml, key string
	}{
		{"unknown key", base + "batchSzie: 10\n", "batchSzie"},
		{"partitionId too large", base + "partitionId: 8\n", "partitionId"},
		{"partitionId negative", base + "partitionId: -2\n", "partitionId"},
		{"batchSize zero", base + "batchSize: 0\n", "batchSize"},
		{"batchSize negative", base + "batchSize: -5\n", "batchSize"},
		{"unreadable yaml", "groupId: [g\n", "yaml"},
		{"partition count differs from the topic's", strings.Replace(base, "totalPartitions: 8", "totalPartitions: 4", 1), "totalPartitions"},
		{"topic missing", base + "topicId: 9\n", "topicId"},
		{"two handlers for one event type", twoHandlers, `handlers[1].eventType: duplicates handlers[0].eventType "order.placed"`},
		{"star inside an event type", strings.Replace(base, `"*"`, `"us*er"`, 1), "handlers[0].eventType"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out := runOnce(t, url, "run", "--config", writeConfig(t, tc.yaml))
			if code != 2 {
				t.Fatalf("exit %d, want 2\n%s", code, out)
			}
			if !strings.Contains(out, tc.key) {
				t.Fatalf("output does not name %q:\n%s", tc.key, out)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		code, out := runOnce(t, url, "run", "--config", filepath.Join(t.TempDir(), "nope.yml"))
		if code != 2 || !strings.Contains(out, "nope.yml") {
			t.Fatalf("exit %d, want 2 naming the file:\n%s", code, out)
		}
	})
	t.Run("migrate refuses two handlers for one event type", func(t *testing.T) {
		code, out := runOnce(t, url, "migrate", "--config", writeConfig(t, twoHandlers))
		if code != 2 || !strings.Contains(out, "handlers[1].eventType") {
			t.Fatalf("exit %d, want 2 naming handlers[1].eventType:\n%s", code, out)
		}
	})
	t.Run("partition mismatch names the command", func(t *testing.T) {
		_, out := runOnce(t, url, "run", "--config", writeConfig(t, strings.Replace(base, "totalPartitions: 8", "totalPartitions: 4", 1)))
		if !strings.Contains(out, "consumer repartition") {
			t.Fatalf("output does not name the repartition command:\n%s", out)
		}
	})
}

func TestMigratePrintIsTheSchema(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	code, out := runOnce(t, url, "migrate", "--print")
	if code != 0 || !strings.Contains(out, "CREATE TABLE outbox_message_t") {
		t.Fatalf("migrate --print: exit %d\n%s", code, tail(out, 500))
	}
	// The printed script applies on its own.
	pool := pgtest.Pool(t, url)
	eventtest.Exec(t, pool, out)
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM pgevents_schema_migrations`); n < 1 {
		t.Fatalf("%d migrations recorded by the printed script", n)
	}
}

// TestDemoRuns runs `consumer demo` briefly against a database given by
// DATABASE_URL, the path `make demo` takes when a server is provided.
func TestDemoRuns(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	code, out := runOnce(t, url, "demo", "--dir", t.TempDir(), "--duration", "2s", "--rate", "500")
	if code != 0 || !strings.Contains(out, "done:") {
		t.Fatalf("demo: exit %d\n%s", code, tail(out, 2000))
	}
}

// TestDemoAsRootInPrivateDir runs `consumer demo` as root, without
// DATABASE_URL, from a directory the postgres user cannot enter (a clone
// under a 0700 home): it must start its cluster where postgres can reach
// it, say where, link to it from .pgevents-demo/pg, and `make clean` must
// remove both.
func TestDemoAsRootInPrivateDir(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: only then does the demo's server run as the postgres user, who may not reach the repository")
	}
	t.Parallel()
	private := t.TempDir()
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(private, ".pgevents-demo", "pg")
	var target string // the cluster's directory, once known
	t.Cleanup(func() {
		if target == "" {
			target, _ = os.Readlink(link)
		}
		if strings.HasPrefix(filepath.Base(target), "pgcluster-") {
			_ = os.RemoveAll(target)
		}
	})

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), "demo", "--duration", "1s", "--rate", "200", "--partitions", "2")
	cmd.Dir = private
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "done:") {
		t.Fatalf("demo: %v\n%s", err, tail(string(out), 2000))
	}
	target, err = os.Readlink(link)
	if err != nil {
		t.Fatalf("no link to the cluster: %v\n%s", err, out)
	}
	if strings.HasPrefix(target, private+"/") || !strings.Contains(string(out), "the cluster is in "+target) {
		t.Fatalf("the cluster is in %s; the demo said:\n%s", target, out)
	}
	if _, err := os.Stat(filepath.Join(target, "data", "PG_VERSION")); err != nil {
		t.Fatal(err)
	}

	if _, err := exec.LookPath("make"); err != nil {
		t.Log("make not found: make clean not checked")
		return
	}
	makefile, err := filepath.Abs("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	makeCmd := exec.CommandContext(ctx, "make", "-s", "-f", makefile, "clean")
	makeCmd.Dir = private
	if out, err := makeCmd.CombinedOutput(); err != nil {
		t.Fatalf("make clean: %v\n%s", err, out)
	}
	for _, p := range []string{target, link} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after make clean, %s: %v", p, err)
		}
	}
}

// TestMigrateChannelOfAnotherInstallation: two installations in one
// database (the schema key) get channels of their own by default; a
// channel set by hand that another installation's topics notify is refused
// with exit status 2, naming the key.
func TestMigrateChannelOfAnotherInstallation(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	base := "groupId: g\ntotalPartitions: 2\nhandlers:\n  - eventType: \"*\"\n    type: log\n"
	for _, s := range []string{"inst_a", "inst_b"} {
		if code, out := runOnce(t, url, "migrate", "--config", writeConfig(t, base+"schema: "+s+"\n")); code != 0 {
			t.Fatalf("migrate %s: exit %d\n%s", s, code, out)
		}
	}
	pool := pgtest.Pool(t, url)
	var a, b string
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT channel FROM inst_a.log_counter), (SELECT channel FROM inst_b.log_counter)`).Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	if a != "event_channel_inst_a" || b != "event_channel_inst_b" {
		t.Fatalf("channels %q and %q, want event_channel_inst_a and event_channel_inst_b", a, b)
	}
	code, out := runOnce(t, url, "migrate", "--config", writeConfig(t, base+"schema: inst_a\nchannel: event_channel_inst_b\n"))
	if code != 2 || !strings.Contains(out, "channel") || !strings.Contains(out, "inst_b") {
		t.Fatalf("migrate with another installation's channel: exit %d, want 2 naming the key and the other schema\n%s", code, out)
	}
	if err := pool.QueryRow(context.Background(), `SELECT channel FROM inst_a.log_counter`).Scan(&a); err != nil || a != "event_channel_inst_a" {
		t.Fatalf("the refused migrate changed the channel to %q (%v)", a, err)
	}
}
