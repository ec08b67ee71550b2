package consumercli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// observedConfig parses a recording configuration with extra keys.
func observedConfig(t *testing.T, url, extra string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(recordingConfig(4, -1, 10) + fmt.Sprintf("databaseUrl: %q\n", url) + extra))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// observedDB returns a migrated database with a 4-partition topic and the
// handled table.
func observedDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.MigratedDB(t)
	pool := pgtest.Pool(t, url)
	if _, _, err := schema.EnsureTopic(context.Background(), pool, 1, 4); err != nil {
		t.Fatal(err)
	}
	eventtest.Exec(t, pool, eventtest.HandledTable)
	return url, pool
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricSum adds the samples of a metric in a text exposition whose line
// contains every one of the label pairs given (like `group="g"`).
func metricSum(body, name string, pairs ...string) (float64, bool) {
	var sum float64
	found := false
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || !(strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			continue
		}
		match := true
		for _, p := range pairs {
			match = match && strings.Contains(rest, p)
		}
		if !match {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(rest[strings.LastIndex(rest, " ")+1:], &v); err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

func appendEvents(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := pgevents.Append(ctx, tx, pgevents.Event{HostID: fmt.Sprintf("h%d", i%13), EventType: "t", Payload: []byte(`{}`)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestObservabilityOff: without metricsAddr nothing is served and the
// consumer gets no Observer.
func TestObservabilityOff(t *testing.T) {
	t.Parallel()
	url, pool := observedDB(t)
	cfg := observedConfig(t, url, "")
	var g errgroup.Group
	obs, err := startObservability(context.Background(), &g, cfg, []*pgxpool.Pool{pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if obs.Observer(0) != nil {
		t.Fatal("an Observer without metricsAddr")
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestObserveRunConsumer runs the run command's consumer with metrics in
// process: /readyz turns 200 once the consumer is attached and listening,
// /metrics counts what the handler did, pprof is served, and cancelling
// stops the consumer and the server.
func TestObserveRunConsumer(t *testing.T) {
	t.Parallel()
	url, pool := observedDB(t)
	cfg := observedConfig(t, url, "metricsAddr: \"127.0.0.1:0\"\npprof: true\n")
	logs := logtest.New(t)
	log := zerolog.New(logs).Level(zerolog.TraceLevel)
	handlers, closeHandlers, err := (&CLI{}).buildHandlers(cfg, 0, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer closeHandlers()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- runConsumers(ctx, cfg, []*pgxpool.Pool{pool}, []pgevents.Config{cfg.Consumer(handlers, &log)})
	}()
	base := "http://" + listenAddr(t, logs)

	pgtest.WaitFor(t, 20*time.Second, "/readyz 200", func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == http.StatusOK
	})
	appendEvents(t, pool, 40)
	eventtest.WaitHandled(t, pool, 40, 30*time.Second)
	pgtest.WaitFor(t, 10*time.Second, "pgevents_events_handled_total = 40", func() bool {
		_, body := httpGet(t, base+"/metrics")
		n, _ := metricSum(body, "pgevents_events_handled_total", `group="g"`)
		return n == 40
	})
	_, body := httpGet(t, base+"/metrics")
	if n, _ := metricSum(body, "pgevents_partitions_owned", `group="g"`); n != 4 {
		t.Errorf("pgevents_partitions_owned = %v, want 4", n)
	}
	// The lag comes from a query at scrape time, bounded by a timeout that
	// a loaded machine can exceed for one scrape (the metric is then left
	// out, not wrong): scrape until it is there.
	var lag float64
	var present bool
	pgtest.WaitFor(t, 20*time.Second, "pgevents_consumer_lag_events exported", func() bool {
		_, body := httpGet(t, base+"/metrics")
		lag, present = metricSum(body, "pgevents_consumer_lag_events", `group="g"`)
		return present
	})
	if lag != 0 {
		t.Errorf("pgevents_consumer_lag_events = %v, want 0", lag)
	}
	if code, _ := httpGet(t, base+"/debug/pprof/"); code != http.StatusOK {
		t.Errorf("/debug/pprof/: %d", code)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("runConsumers: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("runConsumers did not return within 20 s of cancel")
	}
	if resp, err := http.Get(base + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("the metrics server still answers after shutdown")
	}
}

// TestObserveConsumerError: when the consumer cannot start, runConsumer
// returns its error unchanged and stops the server.
func TestObserveConsumerError(t *testing.T) {
	t.Parallel()
	url, pool := observedDB(t)
	cfg := observedConfig(t, url, "metricsAddr: \"127.0.0.1:0\"\n")
	cfg.TotalPartitions = 8 // the topic has 4
	handlers, closeHandlers, err := (&CLI{}).buildHandlers(cfg, 0, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer closeHandlers()
	log := zerolog.Nop()
	err = runConsumers(context.Background(), cfg, []*pgxpool.Pool{pool}, []pgevents.Config{cfg.Consumer(handlers, &log)})
	var mismatch *pgevents.PartitionMismatchError
	if !errors.As(err, &mismatch) {
		t.Fatalf("runConsumers: %v (%T), want *pgevents.PartitionMismatchError", err, err)
	}
}

// TestObserveBusyAddress: an address in use fails before the consumer
// starts.
func TestObserveBusyAddress(t *testing.T) {
	t.Parallel()
	url, pool := observedDB(t)
	cfg := observedConfig(t, url, "metricsAddr: \"127.0.0.1:0\"\n")
	ctx, cancel := context.WithCancel(context.Background())
	var g errgroup.Group
	obs, err := startObservability(ctx, &g, cfg, []*pgxpool.Pool{pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Error(err)
		}
	}()
	if code, _ := httpGet(t, "http://"+obs.addr+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before a consumer is attached: %d, want 503", code)
	}
	busy := observedConfig(t, url, fmt.Sprintf("metricsAddr: %q\n", obs.addr))
	var g2 errgroup.Group
	if _, err := startObservability(ctx, &g2, busy, []*pgxpool.Pool{pool}, nil); err == nil || !strings.Contains(err.Error(), "metricsAddr") {
		t.Fatalf("second server on %s: %v, want an error naming metricsAddr", obs.addr, err)
	}
}

var addrRE = regexp.MustCompile(`"addr":"([^"]+)"`)

// listenAddr waits for the "metrics server listening" log line and returns
// its address.
func listenAddr(t *testing.T, logs interface{ String() string }) string {
	t.Helper()
	var addr string
	pgtest.WaitFor(t, 30*time.Second, "the metrics server's address in the log (is runConsumer wired into run.go?)", func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			if !strings.Contains(line, "metrics server listening") {
				continue
			}
			if m := addrRE.FindStringSubmatch(line); m != nil {
				addr = m[1]
				return true
			}
		}
		return false
	})
	return addr
}

// TestObserveProcess runs `consumer run` with metricsAddr and scrapes it.
func TestObserveProcess(t *testing.T) {
	t.Parallel()
	url, pool := migrated(t, 4)
	cfg := writeConfig(t, strings.Replace(recordingConfig(4, -1, 10), "logLevel: warn", "logLevel: info", 1)+
		"logFormat: json\nmetricsAddr: \"127.0.0.1:0\"\n")
	p := start(t, url, "run", "--config", cfg)
	base := "http://" + listenAddr(t, p.out)
	pgtest.WaitFor(t, 20*time.Second, "/readyz 200", func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == http.StatusOK
	})
	appendEvents(t, pool, 25)
	eventtest.WaitHandled(t, pool, 25, 30*time.Second)
	pgtest.WaitFor(t, 10*time.Second, "pgevents_events_handled_total = 25", func() bool {
		_, body := httpGet(t, base+"/metrics")
		n, _ := metricSum(body, "pgevents_events_handled_total", `group="g"`)
		return n == 25
	})
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("consumer exited %d after SIGTERM", code)
	}
	// The log line is JSON with the fields operators grep for.
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, "metrics server listening") {
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["level"] != "info" {
				t.Errorf("log line %q: %v", line, err)
			}
		}
	}
}
