// Package sinktest holds test helpers for the relays (sink/kafkasink,
// sink/webhook) and the binary's relay tests: running a consumer on the
// production pool settings, reading back what reached Kafka, and checking
// it against the log: every event present, duplicates only of events
// already delivered, per-host order once duplicates are removed.
package sinktest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/pgeventstest"
)

// StartConsumer runs a consumer of cfg (GroupID "g" and the tests' schema
// unless set) with pgeventstest.StartConsumer on pool's database until the
// test ends.
func StartConsumer(t testing.TB, pool *pgxpool.Pool, cfg pgevents.Config) *pgevents.Consumer {
	t.Helper()
	if cfg.GroupID == "" {
		cfg.GroupID = "g"
	}
	if cfg.Schema == "" {
		cfg.Schema = pgtest.Schema() // the tests' schema mode (PGEVENTS_TEST_SCHEMA)
	}
	c, _ := pgeventstest.StartConsumer(t, pool.Config().ConnString(), cfg)
	return c
}

// AppendTx appends evs in one transaction.
func AppendTx(t testing.TB, pool *pgxpool.Pool, evs ...pgevents.Event) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := pgevents.Append(context.Background(), tx, evs...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// WaitCaughtUp waits until group has consumed every event of topic 1:
// handled, dead-lettered or parked.
func WaitCaughtUp(t testing.TB, pool *pgxpool.Pool, group string, timeout time.Duration) {
	t.Helper()
	pgtest.WaitFor(t, timeout, "group "+group+" caught up", func() bool {
		return Lag(t, pool, group) == 0
	})
}

// Lag returns the events of topic 1 that group has not consumed yet.
func Lag(t testing.TB, pool *pgxpool.Pool, group string) int64 {
	t.Helper()
	var n int64
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_message_t m
		WHERE m.topic_id = 1 AND m.c_offset >= coalesce((SELECT o.next_offset FROM consumer_offsets o
			WHERE o.group_id = $1 AND o.topic_id = 1 AND o.partition_id = m.partition_id), 0)`, group).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// QueryInt runs a query that returns one integer.
func QueryInt(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// DeadLetter is a row of dead_letter_queue.
type DeadLetter struct {
	ID          int64
	Partition   int
	FirstOffset int64
	LastOffset  int64
	EventIDs    []string
	Error       string
	Attempts    int
}

// DeadLetters returns the dead letters of group, by id.
func DeadLetters(t testing.TB, pool *pgxpool.Pool, group string) []DeadLetter {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, partition_id, first_offset, last_offset, event_ids::text[], error, attempts
		FROM dead_letter_queue WHERE group_id = $1 ORDER BY id`, group)
	if err != nil {
		t.Fatal(err)
	}
	dls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.ID, &d.Partition, &d.FirstOffset, &d.LastOffset, &d.EventIDs, &d.Error, &d.Attempts)
		return d, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return dls
}

// LogEvent is an event of the log as the checks need it.
type LogEvent struct {
	EventID       string
	Offset        int64
	Partition     int
	HostID        string
	UserID        string
	EventType     string
	TransactionID int64
	CreatedAt     time.Time
}

// Log returns every event of topic 1, by event id.
func Log(t testing.TB, pool *pgxpool.Pool) map[string]LogEvent {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id::text, c_offset, partition_id, host_id, coalesce(user_id, ''),
		event_type, transaction_id, created_at FROM outbox_message_t WHERE topic_id = 1`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]LogEvent{}
	var e LogEvent
	_, err = pgx.ForEachRow(rows, []any{&e.EventID, &e.Offset, &e.Partition, &e.HostID, &e.UserID, &e.EventType, &e.TransactionID, &e.CreatedAt},
		func() error {
			out[e.EventID] = e
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Record is a Kafka record read back.
type Record struct {
	Partition int32
	Offset    int64
	Key       string
	Value     []byte
	Headers   map[string]string
}

// ReadTopic reads every record of topic's partitions (0 to partitions-1)
// from the brokers, up to the high watermarks at the time of the call.
func ReadTopic(t testing.TB, brokers []string, topic string, partitions int) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = int32(p)
		rp.Timestamp = -1 // the high watermark
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	hwm := map[int32]int64{}
	shards := cl.RequestSharded(ctx, req)
	for _, sh := range shards {
		if sh.Err != nil {
			t.Fatalf("list offsets: %v", sh.Err)
		}
		for _, rt := range sh.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, rp := range rt.Partitions {
				if rp.ErrorCode != 0 {
					t.Fatalf("list offsets of %s/%d: error code %d", topic, rp.Partition, rp.ErrorCode)
				}
				hwm[rp.Partition] = rp.Offset
			}
		}
	}
	offsets := map[int32]kgo.Offset{}
	want := 0
	for p, h := range hwm {
		if h > 0 {
			offsets[p] = kgo.NewOffset().AtStart()
			want += int(h)
		}
	}
	if want == 0 {
		return nil
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var out []Record
	done := map[int32]bool{}
	for len(done) < len(offsets) {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s: %d records of %d by the deadline", topic, len(out), want)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= hwm[r.Partition] {
				return
			}
			hs := make(map[string]string, len(r.Headers))
			for _, h := range r.Headers {
				hs[h.Key] = string(h.Value)
			}
			out = append(out, Record{Partition: r.Partition, Offset: r.Offset, Key: string(r.Key), Value: r.Value, Headers: hs})
			if r.Offset == hwm[r.Partition]-1 {
				done[r.Partition] = true
			}
		})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Partition != out[j].Partition {
			return out[i].Partition < out[j].Partition
		}
		return out[i].Offset < out[j].Offset
	})
	return out
}

// Delivery is what CheckRecords found.
type Delivery struct {
	Records    int // records read
	Duplicates int // records of an event_id read before
	Hosts      int
}

// CheckRecords checks the records of one topic against the log: every
// event of the log is present by event_id, no record names an event the
// log does not hold, a duplicate repeats an event_id already seen in its
// Kafka partition, each host's records are in one Kafka partition and, with
// duplicates removed (the first copy kept), in c_offset order; keys are the
// host ids and the headers carry the event's fields. Events whose id is in
// skip (dead-lettered) must be absent.
func CheckRecords(t testing.TB, recs []Record, log map[string]LogEvent, skip map[string]bool) Delivery {
	t.Helper()
	d := Delivery{Records: len(recs)}
	seen := map[string]bool{}
	hostPart := map[string]int32{}
	last := map[string]LogEvent{} // per host, the last first copy
	var problems []string
	fail := func(format string, args ...any) {
		if len(problems) < 10 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	for _, r := range recs {
		id := r.Headers["event_id"]
		e, ok := log[id]
		if !ok {
			fail("record %d/%d names event_id %q, not in the log", r.Partition, r.Offset, id)
			continue
		}
		if skip[id] {
			fail("record %d/%d is event %s, which was dead-lettered", r.Partition, r.Offset, id)
		}
		if p, ok := hostPart[e.HostID]; ok && p != r.Partition {
			fail("host %s in Kafka partitions %d and %d", e.HostID, p, r.Partition)
		}
		hostPart[e.HostID] = r.Partition
		if r.Key != e.HostID {
			fail("record %d/%d: key %q, want the host_id %q", r.Partition, r.Offset, r.Key, e.HostID)
		}
		for k, want := range map[string]string{
			"event_type": e.EventType, "host_id": e.HostID, "user_id": e.UserID,
			"c_offset": strconv.FormatInt(e.Offset, 10), "topic_id": "1",
			"partition_id": strconv.Itoa(e.Partition), "transaction_id": strconv.FormatInt(e.TransactionID, 10),
		} {
			if got, ok := r.Headers[k]; !ok || got != want {
				fail("record %d/%d: header %s = %q, want %q", r.Partition, r.Offset, k, got, want)
			}
		}
		if ts, err := time.Parse(time.RFC3339Nano, r.Headers["created_at"]); err != nil || !ts.Equal(e.CreatedAt) {
			fail("record %d/%d: header created_at %q, want %s", r.Partition, r.Offset, r.Headers["created_at"], e.CreatedAt)
		}
		if seen[id] {
			d.Duplicates++
			continue
		}
		seen[id] = true
		if prev, ok := last[e.HostID]; ok && prev.Offset >= e.Offset && prev.Partition == e.Partition {
			fail("host %s: event at c_offset %d (record %d/%d) after %d", e.HostID, e.Offset, r.Partition, r.Offset, prev.Offset)
		}
		last[e.HostID] = e
	}
	var missing []int64
	for id, e := range log {
		if !seen[id] && !skip[id] {
			missing = append(missing, e.Offset)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		fail("%d events missing from Kafka, offsets %v", len(missing), missing[:min(len(missing), 20)])
	}
	if len(problems) > 0 {
		t.Fatalf("%d records, %d duplicates:\n%s", d.Records, d.Duplicates, joinLines(problems))
	}
	d.Hosts = len(hostPart)
	return d
}

func joinLines(ls []string) string {
	var s string
	for _, l := range ls {
		s += "  " + l + "\n"
	}
	return s
}

// Counter counts calls concurrently, for test servers.
type Counter struct {
	mu sync.Mutex
	n  map[string]int
}

// Add adds one to key and returns the new count.
func (c *Counter) Add(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	return c.n[key]
}

// Get returns key's count.
func (c *Counter) Get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}
