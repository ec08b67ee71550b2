package consumercli

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// kafkaSection serves topic 1 as "events" on a free loopback port.
const kafkaSection = "kafka: {listen: '127.0.0.1:0', topics: {events: 1}}\n"

// kafkaConfig is recordingConfig at log level info (the endpoint's line
// gives its address) with kafkaSection.
func kafkaConfig(partitions int) string {
	return strings.Replace(recordingConfig(partitions, -1, 10), "logLevel: warn", "logLevel: info", 1) + kafkaSection
}

// kafkaListening waits for the endpoint's line and returns the address it
// listens on.
func kafkaListening(t *testing.T, p *proc) string {
	t.Helper()
	re := regexp.MustCompile(`"listen":"(127\.0\.0\.1:\d+)"[^\n]*"message":"kafka endpoint listening"`)
	var addr string
	pgtest.WaitFor(t, 30*time.Second, "the kafka endpoint's line", func() bool {
		if m := re.FindStringSubmatch(p.out.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	if !strings.Contains(p.out.String(), `"advertised":"127.0.0.1:`) {
		t.Errorf("the endpoint's line does not give the advertised address:\n%s", tail(p.out.String(), 2000))
	}
	return addr
}

// pollRecords polls cl until it has n records or ctx ends, and returns
// them; a fetch error fails the test.
func pollRecords(ctx context.Context, t *testing.T, cl *kgo.Client, n int) []*kgo.Record {
	t.Helper()
	var recs []*kgo.Record
	for len(recs) < n && ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		for _, fe := range fs.Errors() {
			if fe.Err != context.DeadlineExceeded && fe.Err != context.Canceled {
				t.Fatalf("fetch %s/%d: %v", fe.Topic, fe.Partition, fe.Err)
			}
		}
		recs = append(recs, fs.Records()...)
	}
	if len(recs) < n {
		t.Fatalf("read %d records, want %d", len(recs), n)
	}
	return recs
}

// TestKafkaCommand: `consumer kafka` serves topic 1 as "events": a Kafka
// client produces records through the process, which become events of
// the topic, and a consumer group reads them back and commits, which the
// pgevents group of its name records; SIGTERM stops it, exit 0.
func TestKafkaCommand(t *testing.T) {
	t.Parallel()
	dbURL, pool := migrated(t, 2)
	p := start(t, dbURL, "kafka", "--config", writeConfig(t, kafkaConfig(2)))
	addr := kafkaListening(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	prod, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	var recs []*kgo.Record
	for i := range 5 {
		key, value := fmt.Sprintf("host-%d", i), fmt.Sprintf(`{"i": %d}`, i) // jsonb's own text form
		want[key] = value
		recs = append(recs, &kgo.Record{Topic: "events", Key: []byte(key), Value: []byte(value)})
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	prod.Close()
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1 AND event_type = 'kafka'`); n != 5 {
		t.Fatalf("%d events of type kafka in topic 1, want the 5 produced", n)
	}

	cons, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup("kafka-clients"), kgo.ConsumeTopics("events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(), kgo.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range pollRecords(ctx, t, cons, 5) {
		got[string(r.Key)] = string(r.Value)
	}
	if !maps.Equal(got, want) {
		t.Errorf("read back %v, want %v", got, want)
	}
	if err := cons.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	cons.Close()
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM subscriptions WHERE group_id = 'kafka-clients' AND topic_id = 1`); n != 1 {
		t.Errorf("the Kafka group has %d pgevents subscriptions, want 1", n)
	}
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("consumer kafka exited %d after SIGTERM", code)
	}
}

// TestKafkaInvalidConfig: a kafka section `consumer kafka` or `consumer
// run` cannot serve exits 2 naming the key, before the database is
// reached.
func TestKafkaInvalidConfig(t *testing.T) {
	t.Parallel()
	base := recordingConfig(2, -1, 10)
	dir := t.TempDir()
	cert := filepath.Join(dir, "cert.pem")
	if err := os.WriteFile(cert, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, tt := range []struct {
		cmd, section, key string
		flags             []string
	}{
		{"kafka", "", "kafka", nil},
		{"kafka", "kafka: {topics: {'bad name!': 1}}\n", "kafka.topics.bad name!", nil},
		{"kafka", "kafka: {topics: {events: 0}}\n", "kafka.topics.events", nil},
		{"kafka", "kafka: {topics: {events: -3}}\n", "kafka.topics.events", nil},
		{"kafka", "kafka: {topics: {events: one}}\n", "kafka.topics.events", nil},
		{"kafka", "kafka: {topics: {events: 1}, tls: {certFile: " + cert + "}}\n", "kafka.tls.keyFile", nil},
		{"kafka", "kafka: {topics: {events: 1}, tls: {certFile: " + missing + "/cert.pem, keyFile: " + cert + "}}\n", "kafka.tls.certFile", nil},
		{"kafka", "kafka: {topics: {events: 1}, tls: {certFile: " + cert + ", keyFile: " + cert + "}}\n", "kafka.tls.certFile", nil},
		{"kafka", "kafka: {listen: localhost, topics: {events: 1}}\n", "kafka.listen", nil},
		{"kafka", "kafka: {topics: {events: 1}}\n", "kafka.listen", []string{"--listen", "9092"}},
		{"kafka", "kafka: {topics: {events: 1}, users: {alice: '${PGEVENTS_TEST_UNSET_PASSWORD}'}}\n", "kafka.users.alice", nil},
		{"run", "kafka: {topics: {'bad name!': 1}}\n", "kafka.topics.bad name!", nil},
		{"run", "kafka: {topics: {events: 1}, tls: {certFile: " + missing + "/cert.pem, keyFile: " + missing + "/key.pem}}\n", "kafka.tls.certFile", nil},
		{"run", "kafka: {topics: {events: 1}, users: {alice: '${PGEVENTS_TEST_UNSET_PASSWORD}'}}\n", "kafka.users.alice", nil},
	} {
		args := append([]string{tt.cmd, "--config", writeConfig(t, base+tt.section)}, tt.flags...)
		// No server listens there: a configuration error must come first.
		code, out := runOnce(t, "postgres://pgevents@127.0.0.1:1/none?connect_timeout=2", args...)
		if code != 2 || !strings.Contains(out, " "+tt.key+": ") {
			t.Errorf("consumer %s with %q %v: exit %d, want 2 naming %s\n%s", tt.cmd, tt.section, tt.flags, code, tt.key, out)
		}
	}
}

// TestRunServesKafka: `consumer run` with a kafka section serves the
// endpoint beside its consumers: a Kafka client reads an event appended to
// the topic the consumers handle, with its host as key and its type as a
// header; SIGTERM stops both, exit 0.
func TestRunServesKafka(t *testing.T) {
	t.Parallel()
	dbURL, pool := migrated(t, 2)
	p := start(t, dbURL, "run", "--config", writeConfig(t, kafkaConfig(2)))
	addr := kafkaListening(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgevents.Append(ctx, tx, pgevents.Event{TopicID: 1, HostID: "host-7", EventType: "user.created", Payload: []byte(`{"a": 1}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := pollRecords(ctx, t, cl, 1)[0]
	cl.Close()
	var eventType string
	for _, h := range r.Headers {
		if h.Key == "event_type" {
			eventType = string(h.Value)
		}
	}
	if string(r.Key) != "host-7" || string(r.Value) != `{"a": 1}` || eventType != "user.created" {
		t.Errorf("record key %q, value %q, event_type %q; want host-7, {\"a\": 1}, user.created", r.Key, r.Value, eventType)
	}
	eventtest.WaitHandled(t, pool, 1, 30*time.Second) // the consumers run beside it
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("consumer run exited %d after SIGTERM", code)
	}
}

// TestKafkaKcat: the README's kcat session against `consumer kafka`:
// lines `key:value` produced with kcat -P, read back with kcat -C to the
// end of the topic, each in its host's partition with the headers. Skipped
// without kcat on the PATH.
func TestKafkaKcat(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("kcat"); err != nil {
		t.Skip("kcat is not installed")
	}
	dbURL, _ := migrated(t, 2)
	p := start(t, dbURL, "kafka", "--config", writeConfig(t, kafkaConfig(2)))
	addr := kafkaListening(t, p)
	kcat := func(stdin string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "kcat", append([]string{"-b", addr, "-t", "events"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kcat %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	kcat("host-1:{\"a\":1}\nhost-2:{\"b\":2}\nhost-1:{\"a\":3}\n", "-P", "-K:")
	out := kcat("", "-C", "-o", "beginning", "-e", "-q", "-f", "%k\t%s\t%h\n")
	byHost := map[string][]string{}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines {
		f := strings.Split(l, "\t")
		if len(f) != 3 || !strings.Contains(f[2], "event_type=kafka") || !strings.Contains(f[2], "event_id=") || !strings.Contains(f[2], "transaction_id=") {
			t.Errorf("record %q: want key, value and the event's headers", l)
			continue
		}
		byHost[f[0]] = append(byHost[f[0]], f[1])
	}
	if len(lines) != 3 || strings.Join(byHost["host-1"], ",") != `{"a": 1},{"a": 3}` || strings.Join(byHost["host-2"], ",") != `{"b": 2}` {
		t.Errorf("kcat -C read:\n%s\nwant host-1's two records in order and host-2's", out)
	}
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("consumer kafka exited %d after SIGTERM", code)
	}
}
