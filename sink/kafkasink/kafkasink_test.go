package kafkasink_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/sinktest"
	"github.com/pgevents/pgevents/sink"
	"github.com/pgevents/pgevents/sink/kafkasink"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// cluster starts an in-process Kafka cluster holding the given topics with
// partitions partitions each.
func cluster(t *testing.T, partitions int32, topics []string, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// relay returns a Kafka relay on c with opts (brokers filled in), closed
// when the test ends.
func relay(t *testing.T, c *kfake.Cluster, opts kafkasink.Options) *kafkasink.Sink {
	t.Helper()
	opts.Brokers = c.ListenAddrs()
	s, err := kafkasink.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func handleAll(h pgevents.Handler) *pgevents.Handlers {
	hs := &pgevents.Handlers{}
	hs.HandleAll(h)
	return hs
}

// appendRandom appends at least n events over hosts hosts, in transactions
// of 1 to 20 events, whose hosts change at random within the transaction,
// and returns how many it appended.
func appendRandom(t *testing.T, seed uint64, pool *pgxpool.Pool, n, hosts int) int {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	total := 0
	for total < n {
		evs := make([]pgevents.Event, 1+rng.IntN(20))
		host := fmt.Sprintf("host-%d", rng.IntN(hosts))
		for i := range evs {
			if rng.IntN(3) == 0 {
				host = fmt.Sprintf("host-%d", rng.IntN(hosts))
			}
			evs[i] = pgevents.Event{HostID: host, UserID: fmt.Sprintf("u%d", rng.IntN(3)), EventType: "t",
				Payload: []byte(fmt.Sprintf(`{"n":%d}`, total+i)), Metadata: []byte(`{"m":1}`)}
		}
		sinktest.AppendTx(t, pool, evs...)
		total += len(evs)
	}
	return total
}

// fastRetry is a consumer configuration that retries failed batches
// quickly.
func fastRetry(partitions int, hs *pgevents.Handlers) pgevents.Config {
	return pgevents.Config{TotalPartitions: partitions, BatchSize: 50, Handlers: hs,
		RetryInitial: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond}
}

// TestRelayInOrderWithHeaders: 3,000 events over 60 hosts, appended while
// the relay runs, reach Kafka each exactly once (nothing failed, so
// nothing is sent twice), keyed by host, in c_offset order per host, with
// the headers; the metrics count them.
func TestRelayInOrderWithHeaders(t *testing.T) {
	t.Parallel()
	c := cluster(t, 6, []string{"events"})
	pool := pgtest.TopicPool(t, 4)
	m := sink.NewMetrics()
	s := relay(t, c, kafkasink.Options{Topic: "events", Metrics: m, Name: "k"})
	sinktest.StartConsumer(t, pool, fastRetry(4, handleAll(s)))
	n := appendRandom(t, 1, pool, 3000, 60)
	sinktest.WaitCaughtUp(t, pool, "g", time.Minute)
	recs := sinktest.ReadTopic(t, c.ListenAddrs(), "events", 6)
	d := sinktest.CheckRecords(t, recs, sinktest.Log(t, pool), nil)
	if d.Duplicates != 0 || d.Records != n {
		t.Fatalf("%d records for %d events, %d duplicates; want exactly one each", d.Records, n, d.Duplicates)
	}
	for _, r := range recs {
		if r.Headers["metadata"] != `{"m": 1}` || !strings.HasPrefix(string(r.Value), `{"n": `) {
			t.Fatalf("record %d/%d: metadata %q, value %q", r.Partition, r.Offset, r.Headers["metadata"], r.Value)
		}
	}
	if got := metric(t, m, "pgevents_sink_records_total", "g", "k", ""); int(got) != n {
		t.Fatalf("pgevents_sink_records_total %v, want %d", got, n)
	}
}

// TestKafkaDownIsTransient: while every produce request fails with
// NOT_ENOUGH_REPLICAS, then while every produce request's connection is
// cut, the partitions wait and retry; nothing is dead-lettered; afterwards
// everything is delivered in order.
func TestKafkaDownIsTransient(t *testing.T) {
	t.Parallel()
	c := cluster(t, 3, []string{"events"})
	pool := pgtest.TopicPool(t, 2)
	m := sink.NewMetrics()
	s := relay(t, c, kafkasink.Options{Topic: "events", DeliveryTimeout: time.Second, Metrics: m})
	cfg := fastRetry(2, handleAll(s))
	// A request cut mid-flight may or may not have been written: the
	// producer retries it until it knows, so the flush runs out of its
	// budget instead of failing after the delivery timeout.
	cfg.HandlerTimeout = 2 * time.Second
	// A failure of unknown class would be dead-lettered after two tries:
	// the outage's failures must be transient.
	cfg.MaxAttempts = 2
	cons := sinktest.StartConsumer(t, pool, cfg)
	appendRandom(t, 2, pool, 200, 20)
	sinktest.WaitCaughtUp(t, pool, "g", 30*time.Second)

	for _, outage := range []string{"not enough replicas", "connections cut"} {
		var stop func()
		switch outage {
		case "not enough replicas":
			h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: -1})
			stop = h.Remove
		default:
			var down = make(chan struct{})
			c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				select {
				case <-down:
					c.DropControl()
					return nil, nil, false
				default:
					c.KeepControl()
					return nil, errors.New("cut"), true // closes the connection
				}
			})
			stop = func() { close(down) }
		}
		retries := cons.Stats().Retries
		appendRandom(t, 3, pool, 300, 20)
		// Long enough for a failure of unknown class to be dead-lettered.
		pgtest.WaitFor(t, 30*time.Second, outage+": batches failing", func() bool { return cons.Stats().Retries >= retries+6 })
		if lag := sinktest.Lag(t, pool, "g"); lag == 0 {
			t.Fatalf("%s: nothing waits while Kafka is down", outage)
		}
		stop()
		sinktest.WaitCaughtUp(t, pool, "g", 30*time.Second)
	}
	if dls := sinktest.DeadLetters(t, pool, "g"); len(dls) != 0 {
		t.Fatalf("%d dead letters while Kafka was down, first: %s", len(dls), dls[0].Error)
	}
	sinktest.CheckRecords(t, sinktest.ReadTopic(t, c.ListenAddrs(), "events", 3), sinktest.Log(t, pool), nil)
	if f := metric(t, m, "pgevents_sink_failures_total", "g", "kafka", "transient"); f == 0 {
		t.Fatal("no transient failure counted")
	}
}

// TestRecordTooLarge: one event's record is over the broker's limit (the
// topic's max.message.bytes, in a batch with other records of the same
// Kafka partition, which the broker refuses as a whole), or over the
// relay's own MaxRecordBytes. Only that event's unit is dead-lettered, with
// the broker's reason; the other hosts' events flow, and the host's own
// later events flow (deadLetter) or wait behind the dead letter (parkHost).
func TestRecordTooLarge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		limit  int // the relay's MaxRecordBytes; 0: default, above the broker's
		policy pgevents.FailurePolicy
	}{
		{"broker refuses, deadLetter", 0, pgevents.PolicyDeadLetter},
		{"broker refuses, parkHost", 0, pgevents.PolicyParkHost},
		{"relay refuses, deadLetter", 32 << 10, pgevents.PolicyDeadLetter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := cluster(t, 1, []string{"events"}, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "65536"}))
			pool := pgtest.TopicPool(t, 1)
			s := relay(t, c, kafkasink.Options{Topic: "events", MaxRecordBytes: tc.limit})
			ev := func(host, payload string) pgevents.Event {
				return pgevents.Event{HostID: host, EventType: "t", Payload: []byte(payload)}
			}
			// Random hex: compression must not bring it under the limit.
			blob := make([]byte, 50<<10)
			for i := range blob {
				blob[i] = byte(rand.Uint32())
			}
			big := fmt.Sprintf(`{"blob":"%x"}`, blob)
			// All in one batch, in one Kafka partition.
			sinktest.AppendTx(t, pool, ev("a", `{"n":1}`), ev("b", `{"n":2}`))
			sinktest.AppendTx(t, pool, ev("b", `{"n":3}`), ev("a", big), ev("b", `{"n":4}`))
			sinktest.AppendTx(t, pool, ev("a", `{"n":5}`), ev("b", `{"n":6}`))
			sinktest.AppendTx(t, pool, ev("b", `{"n":7}`))
			cfg := fastRetry(1, handleAll(s))
			cfg.OnPermanentFailure = tc.policy
			sinktest.StartConsumer(t, pool, cfg)
			sinktest.WaitCaughtUp(t, pool, "g", 30*time.Second)
			dls := sinktest.DeadLetters(t, pool, "g")
			if len(dls) != 1 || dls[0].FirstOffset != 3 || dls[0].LastOffset != 5 || dls[0].Attempts != 1 ||
				!strings.Contains(dls[0].Error, "MESSAGE_TOO_LARGE") || !strings.Contains(dls[0].Error, "offset 4") {
				t.Fatalf("dead letters %+v, want the unit at offsets 3-5 with MESSAGE_TOO_LARGE at offset 4, at its first failure", dls)
			}
			log := sinktest.Log(t, pool)
			skip := map[string]bool{}
			for _, id := range dls[0].EventIDs {
				skip[id] = true
			}
			if tc.policy == pgevents.PolicyParkHost {
				for id, e := range log {
					if e.Offset > 5 {
						skip[id] = true // the unit's hosts, a and b, wait behind the dead letter
					}
				}
				if n := sinktest.QueryInt(t, pool, `SELECT count(*) FROM parked_events`); n != 3 {
					t.Fatalf("%d parked events, want the 3 after the unit", n)
				}
			}
			recs := sinktest.ReadTopic(t, c.ListenAddrs(), "events", 1)
			// Offset 3, before the refused record in its unit, may have
			// reached Kafka in the attempt that failed.
			for _, r := range recs {
				if r.Headers["c_offset"] == "3" {
					delete(skip, r.Headers["event_id"])
				}
			}
			d := sinktest.CheckRecords(t, recs, log, skip)
			// The retry after the refusal sends only what was not
			// acknowledged: no duplicates.
			if d.Duplicates != 0 {
				t.Fatalf("%d duplicates", d.Duplicates)
			}
		})
	}
}

// TestRefusedRecordAmongMany: the broker refuses the second of 2,000
// events, handed to a new producer in one attempt; the producer is still
// placing the attempt's records in its batches when the refusal comes
// back. No event after the refused one may reach Kafka ahead of the events
// it follows: only its unit is dead-lettered, every other event reaches
// Kafka once, in its host's order (after the host's dead letter, under
// deadLetter; not at all for the host, under parkHost).
func TestRefusedRecordAmongMany(t *testing.T) {
	t.Parallel()
	for _, policy := range []pgevents.FailurePolicy{pgevents.PolicyDeadLetter, pgevents.PolicyParkHost} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			c := cluster(t, 1, []string{"events"}, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "65536"}))
			// The first answer about the topic comes late: the attempt's
			// records are all produced before the producer knows where
			// they go, and it places them while its flush runs.
			var delayed atomic.Bool
			c.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				for _, rt := range kreq.(*kmsg.MetadataRequest).Topics {
					if rt.Topic != nil && *rt.Topic == "events" && !delayed.Swap(true) {
						time.Sleep(300 * time.Millisecond) // a slow broker, not a synchronisation
					}
				}
				return nil, nil, false
			})
			pool := pgtest.TopicPool(t, 1)
			s := relay(t, c, kafkasink.Options{Topic: "events", ClientOptions: []kgo.Opt{kgo.WithHooks(slowPlacing{})}})
			blob := make([]byte, 50<<10)
			for i := range blob {
				blob[i] = byte(rand.Uint32())
			}
			sinktest.AppendTx(t, pool, pgevents.Event{HostID: "host-0", EventType: "t", Payload: []byte(`{"n":0}`)})
			sinktest.AppendTx(t, pool, pgevents.Event{HostID: "host-0", EventType: "t", Payload: []byte(fmt.Sprintf(`{"blob":"%x"}`, blob))})
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			appendRandom(t, seed, pool, 2000, 20)
			cfg := fastRetry(1, handleAll(s))
			cfg.BatchSize = 5000
			cfg.OnPermanentFailure = policy
			sinktest.StartConsumer(t, pool, cfg)
			sinktest.WaitCaughtUp(t, pool, "g", time.Minute)
			dls := sinktest.DeadLetters(t, pool, "g")
			if len(dls) != 1 || dls[0].FirstOffset != 2 || dls[0].LastOffset != 2 || !strings.Contains(dls[0].Error, "MESSAGE_TOO_LARGE") {
				t.Fatalf("seed %d: dead letters %+v, want the unit at offset 2, MESSAGE_TOO_LARGE", seed, dls)
			}
			log := sinktest.Log(t, pool)
			skip := map[string]bool{dls[0].EventIDs[0]: true}
			if policy == pgevents.PolicyParkHost {
				// Parked: host-0's later events, and those of the units
				// that hold them, transitively (a unit is a transaction).
				rows, _ := pool.Query(context.Background(), `SELECT c_offset FROM parked_events WHERE group_id = 'g'`)
				parked, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				if err != nil {
					t.Fatal(err)
				}
				for id, e := range log {
					if slices.Contains(parked, e.Offset) {
						skip[id] = true
					} else if e.HostID == "host-0" && e.Offset > 2 {
						t.Fatalf("seed %d: host-0's event at offset %d is not parked", seed, e.Offset)
					}
				}
			}
			d := sinktest.CheckRecords(t, sinktest.ReadTopic(t, c.ListenAddrs(), "events", 1), log, skip)
			if d.Duplicates != 0 {
				t.Fatalf("seed %d: %d duplicates", seed, d.Duplicates)
			}
		})
	}
}

// slowPlacing is a producer hook that makes the producer slow to place
// the records of c_offsets 3 to 40 in their batches, as a loaded machine
// may: it holds the partition's buffer 2 ms for each.
type slowPlacing struct{}

func (slowPlacing) OnProduceRecordPartitioned(r *kgo.Record, _ int32) {
	for _, h := range r.Headers {
		if h.Key == "c_offset" {
			if n, _ := strconv.Atoi(string(h.Value)); n >= 3 && n <= 40 {
				time.Sleep(2 * time.Millisecond) // a descheduled producer, not a synchronisation
			}
		}
	}
}

// TestCloudEventsAndTopicTemplate: records go to the topic the template
// renders, as CloudEvents in binary mode; an event whose rendered topic is
// not a valid Kafka topic name is dead-lettered.
func TestCloudEventsAndTopicTemplate(t *testing.T) {
	t.Parallel()
	c := cluster(t, 2, []string{"ev.created", "ev.deleted"})
	pool := pgtest.TopicPool(t, 1)
	s := relay(t, c, kafkasink.Options{Topic: "ev.{event_type}", Format: kafkasink.FormatCloudEvents, Source: "/portal"})
	sinktest.AppendTx(t, pool, pgevents.Event{HostID: "h1", EventType: "created", Payload: []byte(`{"id":1}`)},
		pgevents.Event{HostID: "h1", EventType: "deleted", Payload: []byte(`{"id":1}`)})
	sinktest.AppendTx(t, pool, pgevents.Event{HostID: "h2", EventType: "bad/type", Payload: []byte(`{}`)})
	sinktest.StartConsumer(t, pool, fastRetry(1, handleAll(s)))
	sinktest.WaitCaughtUp(t, pool, "g", 30*time.Second)
	log := sinktest.Log(t, pool)
	for _, typ := range []string{"created", "deleted"} {
		recs := sinktest.ReadTopic(t, c.ListenAddrs(), "ev."+typ, 2)
		if len(recs) != 1 {
			t.Fatalf("topic ev.%s: %d records, want 1", typ, len(recs))
		}
		r := recs[0]
		e := log[r.Headers["event_id"]]
		want := map[string]string{"ce_specversion": "1.0", "ce_id": e.EventID, "ce_type": typ, "ce_source": "/portal",
			"ce_subject": "h1", "content-type": "application/json", "ce_time": r.Headers["created_at"]}
		for k, v := range want {
			if r.Headers[k] != v || v == "" {
				t.Errorf("topic ev.%s: header %s = %q, want %q", typ, k, r.Headers[k], v)
			}
		}
		if string(r.Value) != `{"id": 1}` {
			t.Errorf("value %s, want the payload", r.Value)
		}
	}
	dls := sinktest.DeadLetters(t, pool, "g")
	if len(dls) != 1 || !strings.Contains(dls[0].Error, "not a valid Kafka topic name") {
		t.Fatalf("dead letters %+v, want the event of type bad/type", dls)
	}
}

// TestHandleOutsideBatch: called outside a consumer's batch (a dead-letter
// replay), the relay produces and waits for the acknowledgement; a refused
// record is a permanent failure.
func TestHandleOutsideBatch(t *testing.T) {
	t.Parallel()
	c := cluster(t, 1, []string{"events"})
	s := relay(t, c, kafkasink.Options{Topic: "events", MaxRecordBytes: 4096})
	ctx := context.Background()
	ev := &pgevents.Event{Offset: 7, EventID: "e7", HostID: "h", EventType: "t", Payload: []byte(`{}`)}
	if err := s.Handle(ctx, nil, ev); err != nil {
		t.Fatal(err)
	}
	recs := sinktest.ReadTopic(t, c.ListenAddrs(), "events", 1)
	if len(recs) != 1 || recs[0].Headers["event_id"] != "e7" || recs[0].Key != "h" {
		t.Fatalf("records %+v, want event e7 keyed h", recs)
	}
	ev.Payload = []byte(`"` + strings.Repeat("x", 8192) + `"`)
	if err := s.Handle(ctx, nil, ev); pgevents.Classify(err) != pgevents.ClassPermanent {
		t.Fatalf("too large: %v (class %v), want a permanent failure", err, pgevents.Classify(err))
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want pgevents.Class
	}{
		{kerr.NotEnoughReplicas, pgevents.ClassTransient},
		{kerr.NotLeaderForPartition, pgevents.ClassTransient},
		{kerr.LeaderNotAvailable, pgevents.ClassTransient},
		{kerr.RequestTimedOut, pgevents.ClassTransient},
		{fmt.Errorf("%w, last err: %w", kgo.ErrRecordTimeout, kerr.NotEnoughReplicas), pgevents.ClassTransient},
		{kgo.ErrRecordTimeout, pgevents.ClassTransient},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, pgevents.ClassTransient},
		{context.DeadlineExceeded, pgevents.ClassTransient},
		{kerr.UnknownTopicOrPartition, pgevents.ClassDeployment},
		{fmt.Errorf("%w, last err: %w", kgo.ErrRecordTimeout, kerr.UnknownTopicOrPartition), pgevents.ClassDeployment},
		{kerr.TopicAuthorizationFailed, pgevents.ClassDeployment},
		{kerr.SaslAuthenticationFailed, pgevents.ClassDeployment},
		{kerr.ClusterAuthorizationFailed, pgevents.ClassDeployment},
		{fmt.Errorf("%w (uncompressed_bytes=9)", kerr.MessageTooLarge), pgevents.ClassPermanent},
		{kerr.RecordListTooLarge, pgevents.ClassPermanent},
		{kerr.InvalidRecord, pgevents.ClassPermanent},
		{kerr.OffsetOutOfRange, pgevents.ClassUnknown},
		{fmt.Errorf("records have timed out, last err: %w", kerr.NotLeaderForPartition), pgevents.ClassTransient},
		{kerr.InvalidTimestamp, pgevents.ClassPermanent},
		{pgevents.Permanent(kerr.NotEnoughReplicas), pgevents.ClassPermanent}, // the relay's word wins
	} {
		if got := kafkasink.Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestInvalidOptions: New names the option at fault.
func TestInvalidOptions(t *testing.T) {
	t.Parallel()
	ok := kafkasink.Options{Brokers: []string{"k:9092"}, Topic: "t"}
	for key, edit := range map[string]func(o *kafkasink.Options){
		"brokers":        func(o *kafkasink.Options) { o.Brokers = nil },
		"topic":          func(o *kafkasink.Options) { o.Topic = "a.{nope}" },
		"key":            func(o *kafkasink.Options) { o.Key = "{host_id" },
		"format":         func(o *kafkasink.Options) { o.Format = "avro" },
		"sasl.mechanism": func(o *kafkasink.Options) { o.SASL = &kafkasink.SASL{Mechanism: "GSSAPI"} },
		"maxRecordBytes": func(o *kafkasink.Options) { o.MaxRecordBytes = 10 },
	} {
		o := ok
		edit(&o)
		_, err := kafkasink.New(o)
		var oe *kafkasink.OptionError
		if !errors.As(err, &oe) || oe.Key != key {
			t.Errorf("%s: %v, want an OptionError for %s", key, err, key)
		}
	}
}

// metric returns the value of the counter name of the relay sink serving
// group (and of class, when given).
func metric(t *testing.T, m *sink.Metrics, name, group, sinkName, class string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["group"] == group && labels["sink"] == sinkName && (class == "" || labels["class"] == class) {
				return mt.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{group=%q,sink=%q,class=%q}", name, group, sinkName, class)
	return 0
}

// TestFailedAttemptSendsNothing: a batch whose attempt fails before its
// flush (another handler failed) leaves records buffered and never sent;
// the next attempt discards them, so Kafka gets each event once.
func TestFailedAttemptSendsNothing(t *testing.T) {
	t.Parallel()
	c := cluster(t, 1, []string{"events"})
	pool := pgtest.TopicPool(t, 1)
	s := relay(t, c, kafkasink.Options{Topic: "events"})
	var failed atomic.Bool
	hs := &pgevents.Handlers{}
	hs.HandleAll(s)
	hs.HandleFunc("flaky", func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
		if failed.CompareAndSwap(false, true) {
			return pgevents.Retryable(errors.New("flaky"))
		}
		return s.Handle(ctx, tx, ev)
	})
	e := func(typ string) pgevents.Event {
		return pgevents.Event{HostID: "h", EventType: typ, Payload: []byte(`{}`)}
	}
	sinktest.AppendTx(t, pool, e("t"), e("t"), e("flaky"), e("t"))
	cons := sinktest.StartConsumer(t, pool, fastRetry(1, hs))
	sinktest.WaitCaughtUp(t, pool, "g", 30*time.Second)
	if cons.Stats().Retries != 1 {
		t.Fatalf("%d retries, want the one of the flaky handler", cons.Stats().Retries)
	}
	d := sinktest.CheckRecords(t, sinktest.ReadTopic(t, c.ListenAddrs(), "events", 1), sinktest.Log(t, pool), nil)
	if d.Duplicates != 0 {
		t.Fatalf("%d duplicates: the failed attempt's records were sent", d.Duplicates)
	}
}

// TestHostOrderAcrossTopics: a topic template that sends a host's events
// to several Kafka topics ("ev.{event_type}") keeps the host's order across
// them. While topic ev.a refuses every record (NOT_ENOUGH_REPLICAS, a
// transient failure), its records are retried and no later record of a
// host waiting on one of them reaches ev.b, although ev.b works: a record
// of a host is written only once the host's earlier records are
// acknowledged, whatever their topic. Afterwards every event is delivered,
// in order per host in each topic, and the hosts whose events all go to
// ev.b were never held up.
func TestHostOrderAcrossTopics(t *testing.T) {
	t.Parallel()
	c := cluster(t, 2, []string{"ev.a", "ev.b"})
	pool := pgtest.TopicPool(t, 2)
	// The producer refreshes its metadata after a refused record at most
	// every 100 ms, not 5 s, so that each attempt fails after about the
	// delivery timeout and the outage ends quickly once the fault goes.
	s := relay(t, c, kafkasink.Options{Topic: "ev.{event_type}", DeliveryTimeout: time.Second,
		ClientOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}})
	cfg := fastRetry(2, handleAll(s))
	cfg.MaxAttempts = 2 // a failure of unknown class would be dead-lettered: the outage's must be transient
	fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "ev.a", Err: kerr.NotEnoughReplicas, Count: -1})
	e := func(host, typ string) pgevents.Event {
		return pgevents.Event{HostID: host, EventType: typ, Payload: []byte(`{}`)}
	}
	// Hosts m0 to m5 go to both topics, in transactions that switch topic
	// within a host and across them; hosts b0 to b5 go to ev.b only.
	for i := range 6 {
		m, b := fmt.Sprintf("m%d", i), fmt.Sprintf("b%d", i)
		sinktest.AppendTx(t, pool, e(m, "b"), e(b, "b"), e(m, "a"), e(m, "b"), e(b, "b"))
		sinktest.AppendTx(t, pool, e(m, "b"), e(m, "a"), e(b, "b"))
		sinktest.AppendTx(t, pool, e(b, "b"), e(m, "a"), e(m, "a"), e(m, "b"))
	}
	cons := sinktest.StartConsumer(t, pool, cfg)
	pgtest.WaitFor(t, 30*time.Second, "batches failing on ev.a", func() bool { return cons.Stats().Retries >= 4 })

	log := sinktest.Log(t, pool)
	firstA := map[string]int64{} // per host, the offset of its first event to ev.a
	for _, ev := range log {
		if f, ok := firstA[ev.HostID]; ev.EventType == "a" && (!ok || ev.Offset < f) {
			firstA[ev.HostID] = ev.Offset
		}
	}
	got := map[string]bool{}
	for _, r := range sinktest.ReadTopic(t, c.ListenAddrs(), "ev.a", 2) {
		t.Fatalf("record %s in ev.a while it refuses every record", r.Headers["event_id"])
	}
	for _, r := range sinktest.ReadTopic(t, c.ListenAddrs(), "ev.b", 2) {
		ev := log[r.Headers["event_id"]]
		got[ev.EventID] = true
		if f, ok := firstA[ev.HostID]; ok && ev.Offset > f {
			t.Fatalf("host %s: event at offset %d reached ev.b while its event at offset %d has not reached ev.a", ev.HostID, ev.Offset, f)
		}
	}
	// Every event that waits for nothing in ev.a went through meanwhile.
	for _, ev := range log {
		if f, ok := firstA[ev.HostID]; ev.EventType == "b" && (!ok || ev.Offset < f) && !got[ev.EventID] {
			t.Fatalf("host %s: event at offset %d, which waits for no record of ev.a, did not reach ev.b during the outage", ev.HostID, ev.Offset)
		}
	}

	fault.Remove()
	sinktest.WaitCaughtUp(t, pool, "g", 30*time.Second)
	if dls := sinktest.DeadLetters(t, pool, "g"); len(dls) != 0 {
		t.Fatalf("%d dead letters, first: %s", len(dls), dls[0].Error)
	}
	for _, topic := range []string{"a", "b"} {
		part := map[string]sinktest.LogEvent{}
		for id, ev := range log {
			if ev.EventType == topic {
				part[id] = ev
			}
		}
		sinktest.CheckRecords(t, sinktest.ReadTopic(t, c.ListenAddrs(), "ev."+topic, 2), part, nil)
	}
}

// TestRecordsCarryTraceContext: events appended inside a producer's span
// reach Kafka with a traceparent header naming that span (its trace id and
// span id), beside an event appended outside any span, whose record has
// none; the consumer traces nothing, so the context is the producer's.
func TestRecordsCarryTraceContext(t *testing.T) {
	t.Parallel()
	c := cluster(t, 1, []string{"events"})
	pool := pgtest.TopicPool(t, 2)
	s := relay(t, c, kafkasink.Options{Topic: "events"})
	sinktest.StartConsumer(t, pool, fastRetry(2, handleAll(s)))
	sc := sinktest.AppendInSpan(t, pool,
		pgevents.Event{HostID: "h1", EventType: "traced", Payload: []byte(`{}`)},
		pgevents.Event{HostID: "h2", EventType: "traced", Payload: []byte(`{}`), Metadata: []byte(`{"m":1}`)})
	sinktest.AppendTx(t, pool, pgevents.Event{HostID: "h1", EventType: "plain", Payload: []byte(`{}`)})
	sinktest.WaitCaughtUp(t, pool, "g", time.Minute)
	recs := sinktest.ReadTopic(t, c.ListenAddrs(), "events", 1)
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	want := sinktest.TraceParent(sc)
	for _, r := range recs {
		got, ok := r.Headers[pgevents.TraceParentKey]
		switch r.Headers["event_type"] {
		case "traced":
			if got != want {
				t.Fatalf("record of host %s: traceparent %q, want the producer's span %q (trace id %s)", r.Headers["host_id"], got, want, sc.TraceID())
			}
		case "plain":
			if ok {
				t.Fatalf("record of an event appended outside a span: traceparent %q, want none", got)
			}
		}
	}
}
