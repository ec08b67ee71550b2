package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// benchResourcesLoad is an offered load of the resources case.
type benchResourcesLoad struct {
	rate      float64 // events/s
	txSize    int
	producers int
}

// benchResourcesLoads are the resources case's loads: 10,000 events/s in
// 100-event transactions, 1,000/s in single-event transactions (what an
// idle-ish consumer's wake-ups and per-batch costs come to per event), and
// 100/s in single-event transactions (what keeping partitions awake
// between sparse events costs: the watcher's reads, per event).
var benchResourcesLoads = []benchResourcesLoad{{10000, 100, 4}, {1000, 1, 4}, {100, 1, 2}}

// benchResourcesGroup is the consumer group of the separate process.
const benchResourcesGroup = "resources"

// benchResources runs this very binary as `consumer run` with a yml
// configuration (8 partitions) in a separate process, offers it a load,
// and reads its CPU time and peak RSS from /proc: once
// with a no-op SQL handler (SELECT 1, one round trip per event) and once
// with the log handler writing to /dev/null (no round trip per event), at
// each of benchResourcesLoads.
func benchResources(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var out []benchResult
	for _, l := range benchResourcesLoads {
		for _, v := range []struct{ name, handler string }{
			{"sql handler SELECT 1", "type: sql\n    statement: SELECT 1"},
			{"log handler to /dev/null", "type: log\n    output: /dev/null"},
		} {
			rs, err := benchResourcesRun(ctx, e, exe, v.name, v.handler, l)
			out = append(out, rs...)
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// benchResourcesRun measures one consumer process with the given handler
// configuration: CPU per event over e.reps windows of steady load, each
// window ending when the process has caught up, and VmHWM at the end.
func benchResourcesRun(ctx context.Context, e *benchEnv, exe, name, handler string, l benchResourcesLoad) ([]benchResult, error) {
	const partitions = 8
	db, err := e.newDB(ctx, partitions)
	if err != nil {
		return nil, err
	}
	defer db.close()
	ppool, err := db.openPool(ctx, "bench-producer", 6, nil)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgevents-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cfgPath := filepath.Join(dir, "db-event-consumer.yml")
	yml := fmt.Sprintf("groupId: %s\ntotalPartitions: %d\nbatchSize: 100\nwaitPeriodMs: 10000\nlogLevel: warn\nlogFormat: json\nhandlers:\n  - eventType: \"*\"\n    %s\n",
		benchResourcesGroup, partitions, handler)
	if err := os.WriteFile(cfgPath, []byte(yml), 0o644); err != nil {
		return nil, err
	}

	cmd := exec.Command(exe, "run", "--config", cfgPath)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.url)
	logs := &benchTail{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	fail := func(err error) ([]benchResult, error) {
		return nil, fmt.Errorf("%s: %w; consumer output: %s", name, err, strings.TrimSpace(logs.String()))
	}
	pid := cmd.Process.Pid
	caughtUp := func() (bool, error) {
		select {
		case err := <-exited:
			exited <- err
			return false, fmt.Errorf("consumer exited: %v", err)
		default:
		}
		var ok bool
		err := db.pool.QueryRow(ctx, `SELECT count(*) = $2 AND bool_and(NOT EXISTS (
    SELECT 1 FROM outbox_message_t m
    WHERE m.topic_id = o.topic_id AND m.partition_id = o.partition_id AND m.c_offset >= o.next_offset))
FROM consumer_offsets o WHERE o.group_id = $1 AND o.topic_id = $3`, benchResourcesGroup, partitions, benchTopic).Scan(&ok)
		return ok, err
	}
	if err := benchWait(ctx, 30*time.Second, "consumer process started", caughtUp); err != nil {
		return fail(err)
	}
	load := benchLoad{producers: l.producers, txSize: l.txSize, rate: newBenchRate(l.rate)}
	if l.txSize == 1 {
		load.txFn = benchAppendCommitTx(benchTopic)
	}
	// Warm up, then measure windows, each from caught up to caught up.
	if _, err := load.run(ctx, ppool, time.Second, nil); err != nil {
		return fail(err)
	}
	if err := benchWait(ctx, 30*time.Second, "consumer caught up", caughtUp); err != nil {
		return fail(err)
	}
	window := benchPick(e, 4*time.Second, 2*time.Second)
	var perEvent []float64
	for rep := range e.reps {
		cpu0, err := benchProcCPU(pid)
		if err != nil {
			return fail(err)
		}
		lr, err := load.run(ctx, ppool, window, nil)
		if err != nil {
			return fail(err)
		}
		if err := benchWait(ctx, 30*time.Second, "consumer caught up", caughtUp); err != nil {
			return fail(err)
		}
		cpu1, err := benchProcCPU(pid)
		if err != nil {
			return fail(err)
		}
		us := float64((cpu1 - cpu0).Microseconds()) / float64(lr.events)
		perEvent = append(perEvent, us)
		e.logf("resources: %s, %g events/s in %d-event tx, window %d: %d events, %.2f µs CPU/event", name, l.rate, l.txSize, rep+1, lr.events, us)
	}
	hwm, err := benchProcStatusKB(pid, "VmHWM")
	if err != nil {
		return fail(err)
	}
	rss, err := benchProcStatusKB(pid, "VmRSS")
	if err != nil {
		return fail(err)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		exited <- err
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			return fail(err)
		}
		if err != nil {
			return fail(fmt.Errorf("exit after SIGTERM: %v", err))
		}
	case <-time.After(20 * time.Second):
		return fail(errors.New("did not exit within 20 s of SIGTERM"))
	}
	e.logf("resources: %s: VmHWM %d kB, VmRSS %d kB", name, hwm, rss)
	proc := fmt.Sprintf("separate `consumer run` process, 8 partitions, batchSize 100, %g events/s offered in %d-event tx by %d paced producers", l.rate, l.txSize, l.producers)
	if l.txSize == 1 {
		proc += " (AppendCommit)"
	}
	name = fmt.Sprintf("%g events/s in %d-event tx, %s", l.rate, l.txSize, name)
	return []benchResult{
		newBenchResult("resources", name+": consumer CPU per event", "µs", perEvent).
			noted("%s; utime+stime from /proc/<pid>/stat over windows of %s, each ending when the process has caught up", proc, window),
		newBenchResult("resources", name+": peak RSS (VmHWM)", "MiB", []float64{float64(hwm) / 1024}).atMost(64).
			noted("VmRSS at the end %.1f MiB", float64(rss)/1024),
	}, nil
}

// benchTail keeps the last few kilobytes written to it, for error messages;
// it is safe for concurrent use.
type benchTail struct {
	mu sync.Mutex
	b  []byte
}

// Write appends p, dropping the oldest bytes beyond 4 KiB.
func (t *benchTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - 4096; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

// String returns what was kept.
func (t *benchTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
