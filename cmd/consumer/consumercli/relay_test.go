package consumercli

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/sinktest"
)

// relayConfig is the configuration of a process relaying every event of
// topic 1 to the Kafka topic portal-events at brokers.
func relayConfig(brokers []string) string {
	return fmt.Sprintf(`groupId: relay
totalPartitions: 8
batchSize: 100
offsetScope: %s
waitPeriodMs: 1000
leaseMs: 1000
retryInitialMs: 20
retryMaxMs: 500
handlerTimeoutMs: 5000
logLevel: warn
handlers:
  - eventType: "*"
    type: kafka
    brokers: ["%s"]
    topic: portal-events
    deliveryTimeoutMs: 1000
`, pgtest.Scope(), strings.Join(brokers, `", "`))
}

// TestKafkaRelayAcceptance: 20,000 events over 300 hosts, in producer
// transactions of 1-20 events over several hosts, are relayed by 3
// consumer processes sharing 8 partitions into a Kafka cluster (kfake, 3
// brokers) whose topic has 12 partitions. Meanwhile:
//
//   - a process is killed with SIGKILL mid-batch: after its records were
//     acknowledged by Kafka and before its offset committed (the test
//     holds a lock that makes commits wait), then restarted;
//   - Kafka refuses every produce request (NOT_ENOUGH_REPLICAS) for 5 s.
//
// Then every event is in Kafka (by event_id), keyed by host, with the
// headers; duplicates exist (the kill) and only repeat event ids already
// delivered; per host, the records of its Kafka partition are in c_offset
// order once duplicates are removed; nothing was dead-lettered.
func TestKafkaRelayAcceptance(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(12, "portal-events"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	url, pool := migrated(t, 8)
	cfg := writeConfig(t, relayConfig(kc.ListenAddrs()))
	procs := make([]*proc, 3)
	for i := range procs {
		procs[i] = start(t, url, "run", "--config", cfg)
	}
	pgtest.WaitFor(t, 20*time.Second, "8 partitions owned", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_ownership WHERE group_id = 'relay' AND live`) == 8
	})

	// Producers: 1,600 events/s in total until 20,000.
	ctx := context.Background()
	const target, rate, producers = 20000, 1600, 4
	var appended atomic.Int64
	var wg sync.WaitGroup
	for i := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			began := time.Now()
			for sent := 0; appended.Load() < target; {
				if d := time.Until(began.Add(time.Duration(sent) * time.Second / (rate / producers))); d > 0 {
					time.Sleep(d) // pacing, not synchronisation
				}
				evs := make([]pgevents.Event, 1+rng.IntN(20))
				host := rng.IntN(300)
				for k := range evs {
					if rng.IntN(4) == 0 {
						host = rng.IntN(300)
					}
					evs[k] = pgevents.Event{HostID: fmt.Sprint("host-", host), UserID: fmt.Sprint("u", rng.IntN(3)),
						EventType: "trade.booked", Payload: []byte(fmt.Sprintf(`{"n":%d}`, k)), Metadata: []byte(`{"p":1}`)}
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := pgevents.Append(ctx, tx, evs...)
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				sent += len(evs)
				appended.Add(int64(len(evs)))
			}
		}()
	}
	reached := func(n int64) {
		pgtest.WaitFor(t, time.Minute, fmt.Sprint(n, " events appended"), func() bool { return appended.Load() >= n })
	}

	// kill -9 between acknowledgement and commit.
	reached(target / 5)
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `LOCK TABLE consumer_positions IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // on failure
	// A batch holds its owner's batch key (batch_backends), and the
	// owner's replica id holds the process id.
	victim, victimReplica := -1, ""
	pgtest.WaitFor(t, 20*time.Second, "a process waiting to commit a relayed batch", func() bool {
		rows, err := pool.Query(ctx, `SELECT r.replica_id FROM consumer_replicas r
			WHERE EXISTS (SELECT 1 FROM pg_stat_activity a
			               WHERE a.wait_event_type = 'Lock' AND a.query LIKE '%INSERT INTO%consumer_positions%'
			                 AND a.pid IN (SELECT b.pid FROM batch_backends(r.replica_id) b))`)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			for i, p := range procs {
				if strings.Contains(name, fmt.Sprintf("-%d-", p.cmd.Process.Pid)) {
					victim, victimReplica = i, name
					return true
				}
			}
		}
		return false
	})
	if err := procs[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-procs[victim].done
	// The machine went with the process: its sessions end too. (A session
	// of a process killed alone would still run the COMMIT the batch sent
	// with its position, once the lock is released.)
	eventtest.Exec(t, pool, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name LIKE $1 OR pid IN (SELECT b.pid FROM batch_backends($2) b)`,
		fmt.Sprintf("%%-%d-%%", procs[victim].cmd.Process.Pid), victimReplica)
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	procs[victim] = start(t, url, "run", "--config", cfg)

	// Kafka down for 5 s.
	reached(target / 2)
	down := kc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: -1})
	lagBefore := sinktest.Lag(t, pool, "relay")
	time.Sleep(5 * time.Second) // the outage being simulated
	if lag := sinktest.Lag(t, pool, "relay"); lag <= lagBefore {
		t.Errorf("lag %d after 5 s of outage, %d before: the relay did not wait", lag, lagBefore)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); n != 0 {
		t.Fatalf("%d dead letters during the outage", n)
	}
	down.Remove()

	wg.Wait()
	if t.Failed() {
		return
	}
	sinktest.WaitCaughtUp(t, pool, "relay", 2*time.Minute)
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
	log := sinktest.Log(t, pool)
	if len(log) != int(appended.Load()) {
		t.Fatalf("%d events in the log, %d appended", len(log), appended.Load())
	}
	d := sinktest.CheckRecords(t, sinktest.ReadTopic(t, kc.ListenAddrs(), "portal-events", 12), log, nil)
	if d.Duplicates == 0 {
		t.Fatal("no duplicates: the kill did not happen between acknowledgement and commit")
	}
	t.Logf("%d events, %d records, %d duplicates, %d hosts", len(log), d.Records, d.Duplicates, d.Hosts)
	for _, p := range procs {
		if code := p.stop(t, 15*time.Second); code != 0 {
			t.Errorf("consumer exited with %d after SIGTERM, want 0", code)
		}
	}
}

// TestInvalidRelayConfigExitsTwo: an invalid relay configuration exits with
// status 2 and names the key.
func TestInvalidRelayConfigExitsTwo(t *testing.T) {
	t.Parallel()
	head := "groupId: g\nhandlers:\n  - eventType: \"*\"\n"
	for _, tc := range []struct{ name, yaml, key string }{
		{"no brokers", head + "    type: kafka\n    topic: t\n", "handlers[0].brokers"},
		{"bad template", head + "    type: kafka\n    brokers: [k:9092]\n    topic: portal.{evnt_type}\n", "handlers[0].topic"},
		{"unknown format", head + "    type: kafka\n    brokers: [k:9092]\n    topic: t\n    format: avro\n", "handlers[0].format"},
		{"missing url", head + "    type: http\n", "handlers[0].url"},
		{"unreadable CA file", head + "    type: http\n    url: https://x\n    tls: {caFile: /nonexistent/ca.pem}\n", "handlers[0].tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out := runOnce(t, pgtest.Server(t), "run", "--config", writeConfig(t, tc.yaml))
			if code != 2 || !strings.Contains(out, tc.key) {
				t.Fatalf("exit %d, want 2 naming %s:\n%s", code, tc.key, out)
			}
		})
	}
}

// TestDemoKafkaRuns runs `consumer demo --sink kafka`: every event
// appended ends up in the in-process broker's topic.
func TestDemoKafkaRuns(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	code, out := runOnce(t, url, "demo", "--dir", t.TempDir(), "--duration", "2s", "--rate", "500", "--sink", "kafka")
	var appended, records int
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "done: ") {
			fmt.Sscanf(line, "done: %d events appended", &appended)
		}
		if strings.HasPrefix(line, "kafka: ") {
			fmt.Sscanf(line, "kafka: %d records", &records)
		}
	}
	if code != 0 || !strings.Contains(out, "relayed/s") || appended == 0 || records != appended {
		t.Fatalf("demo --sink kafka: exit %d, %d events appended, %d records in Kafka\n%s", code, appended, records, tail(out, 2000))
	}
}

// TestRelayMetricsServed: a kafka handler's metrics are served on the run
// command's /metrics, labelled by group and relay name.
func TestRelayMetricsServed(t *testing.T) {
	t.Parallel()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "events"))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	url, pool := observedDB(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`databaseUrl: %q
groupId: g
totalPartitions: 4
metricsAddr: "127.0.0.1:0"
handlers:
  - eventType: "*"
    type: kafka
    name: portal
    brokers: [%q]
    topic: events
`, url, kc.ListenAddrs()[0])))
	if err != nil {
		t.Fatal(err)
	}
	logs := logtest.New(t)
	log := zerolog.New(logs).Level(zerolog.TraceLevel)
	handlers, closeHandlers, err := (&CLI{}).buildHandlers(cfg, 0, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer closeHandlers()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runConsumers(ctx, cfg, []*pgxpool.Pool{pool}, []pgevents.Config{cfg.Consumer(handlers, &log)})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runConsumers: %v", err)
		}
	}()
	base := "http://" + listenAddr(t, logs)
	appendEvents(t, pool, 40)
	labels := []string{`group="g"`, `sink="portal"`, `type="kafka"`}
	pgtest.WaitFor(t, 30*time.Second, "pgevents_sink_records_total = 40", func() bool {
		_, body := httpGet(t, base+"/metrics")
		n, _ := metricSum(body, "pgevents_sink_records_total", labels...)
		return n == 40
	})
	_, body := httpGet(t, base+"/metrics")
	if n, _ := metricSum(body, "pgevents_sink_latency_seconds_count", labels...); n != 40 {
		t.Errorf("pgevents_sink_latency_seconds_count = %v, want 40", n)
	}
	if _, ok := metricSum(body, "pgevents_sink_failures_total", append(labels, `class="permanent"`)...); !ok {
		t.Error("pgevents_sink_failures_total{class=permanent} not exposed")
	}
}
