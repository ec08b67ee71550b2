package kafka_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/schema"
)

// allScopes are the offset scopes a topic can have: topic (a partition's
// offsets have gaps), partition (dense offsets) and sequenced (dense
// offsets per partition, assigned after commit).
var allScopes = []string{schema.ScopeTopic, schema.ScopePartition, schema.ScopeSequenced}

// newLiveEnv is newEnv with, for a sequenced topic, its sequencer running
// until the test ends.
func newLiveEnv(t *testing.T, partitions int, scope string, opts kafka.Options) *env {
	t.Helper()
	e := newEnv(t, partitions, scope, opts)
	if scope == schema.ScopeSequenced {
		e.sequence(e.ctx)
	}
	return e
}

// removePrefix fills topic 1 with 4,500 events over several segments of
// each partition and lets retention remove what it may; it returns each
// partition's retained offsets, in order.
func (e *env) removePrefix(t *testing.T) map[int32][]int64 {
	t.Helper()
	pgtest.ResizeSegments(t, e.pool, 1, schema.MinSegmentSize)
	if _, err := e.pool.Exec(e.ctx, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object(
    'host_id', 'old-' || (i % 7), 'event_type', 't', 'payload', jsonb_build_object('i', i)))
  FROM generate_series(1, 4500) i))`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the 4,500 events in the log", func() bool { return e.countLog() == 4500 })
	if e.retainAll(t) == 0 {
		t.Fatal("retention removed nothing: the test needs a prefix removed")
	}
	// Retention keeps events from now on.
	if err := schema.SetRetention(e.ctx, e.pool, 1, schema.Retention{Retention: time.Hour, ZeroSubscription: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return e.offsetsByPartition()
}

// TestKcatGroupJoinsEmptyPartitions: kcat (librdkafka) joins group grp
// with auto.offset.reset latest or earliest while the topic's partitions
// hold nothing (or, after retention removed a prefix, nothing past what
// it removed), and waits at each partition's end; then transactions
// append events to every partition. Under scope topic, a partition's
// first event lands at an offset far above 1 (offsets are topic-wide): a
// broker does not move a log start for that, and the fetch waiting at 1
// serves the event. kcat prints every committed event
// once, in order per partition and per host, and none of the earlier ones
// with latest; with earliest after retention, every retained event too.
// The commit on SIGTERM leaves the group's positions after the last event
// of each partition.
func TestKcatGroupJoinsEmptyPartitions(t *testing.T) {
	t.Parallel()
	for _, scope := range allScopes {
		for _, reset := range []string{"latest", "earliest"} {
			for _, retained := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s", scope, reset)
				if retained {
					name += "/after retention"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					seed := uint64(time.Now().UnixNano())
					e := newLiveEnv(t, 4, scope, kafka.Options{})
					ctx, cancel := context.WithTimeout(e.ctx, 120*time.Second)
					defer cancel()
					want := map[string][]string{}
					var kept map[int32][]int64
					if retained {
						kept = e.removePrefix(t)
						if reset == "earliest" {
							for _, r := range e.readLog() {
								want[r.host] = append(want[r.host], r.payload)
							}
						}
					}
					s := newSeen()
					p := startKcat(ctx, t, nil, func(m kcatMessage) { s.add("kcat", m.record()) },
						"-b", e.addr, "-G", "grp", "-J", "-u", "-X", "auto.offset.reset="+reset,
						"-X", "auto.commit.interval.ms=600000", "events")
					// kcat is placed when its fetches wait at the end of
					// every partition.
					waitFor(t, 60*time.Second, fmt.Sprintf("kcat to wait at the end of the 4 partitions, having read %d retained events (seed %d)", total(want), seed), func() bool {
						return len(e.srv.WaitingOn(1)) == 4 && s.count() >= total(want)
					})
					before := e.offsetsByPartition()
					news := e.produceRandom(seed, 60, 16)
					for h, w := range news {
						want[h] = append(want[h], w...)
					}
					var after map[int32][]int64
					waitFor(t, 30*time.Second, "the new events in the log", func() bool {
						after = e.offsetsByPartition()
						return logSize(after) == logSize(before)+total(news)
					})
					beyond := 0 // partitions whose first new event is not at the offset kcat waits at
					for pt := range int32(4) {
						news := after[pt][len(before[pt]):]
						if len(news) == 0 {
							t.Fatalf("partition %d: no new event; the test needs every partition to get some (seed %d)", pt, seed)
						}
						end := int64(1)
						if k := kept[pt]; len(k) > 0 {
							end = k[len(k)-1] + 1
						}
						if news[0] > end {
							beyond++
						}
					}
					if scope == schema.ScopeTopic && beyond == 0 {
						t.Fatalf("scope %s: every partition's first new event is at its end; the test does not exercise a log start below the first event (seed %d)", scope, seed)
					}
					n := total(want)
					waitFor(t, 60*time.Second, fmt.Sprintf("kcat to print %d messages (seed %d)", n, seed), func() bool { return s.count() >= n })
					if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
						t.Fatal(err)
					}
					p.wait()
					s.check(t, want, seed)
					if strings.Contains(p.stderr.String(), "Offset out of range") {
						t.Errorf("kcat was told an offset was out of range (seed %d):\n%s", seed, p.stderr.String())
					}
					checkPositions(t, e, "grp", s, seed)
				})
			}
		}
	}
}

// logSize counts the offsets of a log read by offsetsByPartition.
func logSize(log map[int32][]int64) int {
	n := 0
	for _, offs := range log {
		n += len(offs)
	}
	return n
}

// TestLogStartOfAnEmptyPartition: a partition that holds nothing answers
// ListOffsets earliest and latest with 1, its first offset, whatever the
// other partitions hold; a fetch at 1 waits and, once the partition's
// first event lands (at offset 57 under scope topic, where offsets are
// topic-wide), serves it, the log start still 1. A fetch below 1 or above
// the high watermark is OFFSET_OUT_OF_RANGE. The same for the partitions a
// repartition adds, in every scope.
func TestLogStartOfAnEmptyPartition(t *testing.T) {
	t.Parallel()
	for _, scope := range allScopes {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			e := newLiveEnv(t, 2, scope, kafka.Options{})
			e.checkEmptyPartition(t, 2, 1, 56)
			if _, err := schema.Repartition(e.ctx, e.pool, 1, 4); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "the endpoint to see 4 partitions", func() bool {
				resp, err := dialRaw(t, e.addr).do(kmsg.NewPtrMetadataRequest())
				return err == nil && len(resp.(*kmsg.MetadataResponse).Topics[0].Partitions) == 4
			})
			e.checkEmptyPartition(t, 4, 3, 20)
		})
	}
}

// checkEmptyPartition checks, in a topic of n partitions, that partition
// p, which holds nothing, starts at 1 and serves its first event from a
// fetch at 1 once fill events have landed in another partition and one
// in p.
func (e *env) checkEmptyPartition(t *testing.T, n int, p int32, fill int) {
	t.Helper()
	host := func(want int32) string {
		for i := 0; ; i++ {
			h := fmt.Sprintf("h%d", i)
			if e.partitionOf(h, n) == want {
				return h
			}
		}
	}
	appendTo := func(h string, k int) {
		t.Helper()
		evs := make([]pgevents.Event, k)
		for i := range evs {
			evs[i] = pgevents.Event{TopicID: 1, HostID: h, EventType: "t", Payload: []byte(fmt.Sprintf(`{"i": %d}`, i))}
		}
		tx, err := e.pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pgevents.Append(e.ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	before := e.countLog()
	appendTo(host((p+1)%int32(n)), fill)
	waitFor(t, 30*time.Second, "the events in the log", func() bool { return e.countLog() == before+fill })
	lo := kmsg.NewPtrListOffsetsRequest()
	lo.SetVersion(7)
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = "events"
	for _, ts := range []int64{-2, -1} {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp = p, ts
		lt.Partitions = append(lt.Partitions, lp)
	}
	lo.Topics = append(lo.Topics, lt)
	resp, err := dialRaw(t, e.addr).do(lo)
	if err != nil {
		t.Fatal(err)
	}
	for i, lp := range resp.(*kmsg.ListOffsetsResponse).Topics[0].Partitions {
		if lp.ErrorCode != 0 || lp.Offset != 1 {
			t.Errorf("empty partition %d: ListOffsets %s: %d (%v), want 1", p, []string{"earliest", "latest"}[i], lp.Offset, kerr.ErrorForCode(lp.ErrorCode))
		}
	}
	fetch := func(offset int64, wait time.Duration) kmsg.FetchResponseTopicPartition {
		t.Helper()
		f := kmsg.NewPtrFetchRequest()
		f.SetVersion(12)
		f.MaxBytes, f.MaxWaitMillis, f.MinBytes = 1<<20, int32(wait.Milliseconds()), 1
		ft := kmsg.NewFetchRequestTopic()
		ft.Topic = "events"
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes = p, offset, 1<<20
		ft.Partitions = append(ft.Partitions, fp)
		f.Topics = append(f.Topics, ft)
		resp, err := dialRaw(t, e.addr).do(f)
		if err != nil {
			t.Fatal(err)
		}
		return resp.(*kmsg.FetchResponse).Topics[0].Partitions[0]
	}
	for _, off := range []int64{0, 2} {
		if fp := fetch(off, 0); fp.ErrorCode != kerr.OffsetOutOfRange.Code || fp.LogStartOffset != 1 || fp.HighWatermark != 1 {
			t.Errorf("empty partition %d: fetch at %d: %v, log start %d, high watermark %d; want OFFSET_OUT_OF_RANGE, 1, 1",
				p, off, kerr.ErrorForCode(fp.ErrorCode), fp.LogStartOffset, fp.HighWatermark)
		}
	}
	got := make(chan kmsg.FetchResponseTopicPartition, 1)
	go func() { got <- fetch(1, 20*time.Second) }()
	waitFor(t, 10*time.Second, "the fetch at 1 to wait", func() bool { _, ok := e.srv.WaitingOn(1)[p]; return ok })
	appendTo(host(p), 1)
	fp := <-got
	var first int64
	if err := e.pool.QueryRow(e.ctx, `SELECT c_offset FROM outbox_message_t WHERE topic_id = 1 AND partition_id = $1`, p).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if fp.ErrorCode != 0 || fp.LogStartOffset != 1 || fp.HighWatermark != first+1 || len(fp.RecordBatches) == 0 {
		t.Fatalf("partition %d: fetch at 1 after its first event landed at %d: %v, log start %d, high watermark %d, %d bytes of records; want the event, log start 1, high watermark %d",
			p, first, kerr.ErrorForCode(fp.ErrorCode), fp.LogStartOffset, fp.HighWatermark, len(fp.RecordBatches), first+1)
	}
	var b kmsg.RecordBatch
	if err := b.ReadFrom(fp.RecordBatches); err != nil {
		t.Fatal(err)
	}
	if b.FirstOffset != first || b.NumRecords != 1 || len(fp.RecordBatches) != 12+int(b.Length) {
		t.Errorf("partition %d: the fetch at 1 served a batch from offset %d of %d records (%d bytes in all), want the one event at %d",
			p, b.FirstOffset, b.NumRecords, len(fp.RecordBatches), first)
	}
}

// TestHighWatermarkFromTheTails: ListOffsets latest is the offset after
// each partition's highest event, read from partition_tails (the row each
// append writes with its events), and from the log itself for a partition
// without a tail row (here its rows deleted by hand, as no path of
// pgevents leaves it: the log's answer is kept for events that reached it
// otherwise).
func TestHighWatermarkFromTheTails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4, "", kafka.Options{})
	e.produceRandom(7, 60, 12)
	want := map[int32]int64{}
	rows, err := e.pool.Query(e.ctx, `SELECT partition_id, max(c_offset) + 1 FROM outbox_message_t WHERE topic_id = 1 GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var (
		p  int32
		hw int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&p, &hw}, func() error { want[p] = hw; return nil }); err != nil {
		t.Fatal(err)
	}
	latest := func() map[int32]int64 {
		t.Helper()
		lo := kmsg.NewPtrListOffsetsRequest()
		lo.SetVersion(7)
		lt := kmsg.NewListOffsetsRequestTopic()
		lt.Topic = "events"
		for p := range int32(4) {
			lp := kmsg.NewListOffsetsRequestTopicPartition()
			lp.Partition, lp.Timestamp = p, -1
			lt.Partitions = append(lt.Partitions, lp)
		}
		lo.Topics = append(lo.Topics, lt)
		resp, err := dialRaw(t, e.addr).do(lo)
		if err != nil {
			t.Fatal(err)
		}
		got := map[int32]int64{}
		for _, lp := range resp.(*kmsg.ListOffsetsResponse).Topics[0].Partitions {
			got[lp.Partition] = lp.Offset
		}
		return got
	}
	if got := latest(); !maps.Equal(got, want) {
		t.Errorf("latest offsets %v, want the log's ends %v", got, want)
	}
	if _, err := e.pool.Exec(e.ctx, `DELETE FROM partition_tails WHERE topic_id = 1 AND partition_id = 2`); err != nil {
		t.Fatal(err)
	}
	if got := latest(); !maps.Equal(got, want) {
		t.Errorf("latest offsets with partition 2's tail rows gone %v, want the log's ends %v", got, want)
	}
}
