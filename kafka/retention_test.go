package kafka_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/schema"
)

// offsetsByPartition reads the offsets topic 1 holds, by partition, in
// order.
func (e *env) offsetsByPartition() map[int32][]int64 {
	e.t.Helper()
	out := map[int32][]int64{}
	for _, r := range e.readLog() {
		out[r.partition] = append(out[r.partition], r.offset)
	}
	return out
}

// retainAll sets topic 1's retention to a millisecond and runs
// maintenance, as consumers run it, until retention has nothing more to
// remove; it returns how many segments went.
func (e *env) retainAll(t *testing.T) int {
	t.Helper()
	if err := schema.SetRetention(e.ctx, e.pool, 1, schema.Retention{Retention: time.Millisecond, ZeroSubscription: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	removed := 0
	waitFor(t, 30*time.Second, "retention removed all it may", func() bool {
		m, err := pgevents.Maintain(e.ctx, e.pool, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		removed += len(m.Retention.Removed)
		return m.Ran && len(m.Retention.Removed) == 0 && m.Retention.Blocked != "" &&
			!strings.Contains(m.Retention.Blocked, "lock was busy")
	})
	return removed
}

// TestRetentionUnderAKafkaConsumer: retention removes the oldest segments
// of a topic while a kgo consumer (no group) is part-way through. A fetch
// at the consumer's next offset, now below the log start, is answered
// OFFSET_OUT_OF_RANGE with the new log start, the end of the last segment
// removed (at or below the first retained event: a broker's log start is
// where deletion stopped); ListOffsets' earliest is that log start; a kgo
// consumer that resumes at its position with reset "start" goes on from
// the first retained event of each partition and reads every retained
// event once, in order.
func TestRetentionUnderAKafkaConsumer(t *testing.T) {
	t.Parallel()
	const parts = 2
	e := newEnv(t, parts, "", kafka.Options{})
	pgtest.ResizeSegments(t, e.pool, 1, schema.MinSegmentSize)
	// 4,500 events, about 2,250 per partition: several segments of each,
	// under either offset scope.
	if _, err := e.pool.Exec(e.ctx, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object(
    'host_id', 'h' || (i % 7), 'event_type', 't', 'payload', jsonb_build_object('i', i)))
  FROM generate_series(1, 4500) i))`); err != nil {
		t.Fatal(err)
	}
	before := e.offsetsByPartition()
	ctx, cancel := context.WithTimeout(e.ctx, 90*time.Second)
	defer cancel()

	// A consumer reads the first 100 events of each partition, and stops.
	start := map[string]map[int32]kgo.Offset{"events": {}}
	for p := range int32(parts) {
		start["events"][p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.ConsumePartitions(start),
		kgo.FetchMaxPartitionBytes(4<<10), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	next := map[int32]int64{} // the consumer's position
	for n := 0; n < parts; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("the first consumer read too little before the deadline")
		}
		for _, fe := range fs.Errors() {
			t.Fatalf("fetch %s/%d: %v", fe.Topic, fe.Partition, fe.Err)
		}
		n = 0
		for _, r := range fs.Records() {
			if want := before[r.Partition][0]; next[r.Partition] == 0 && r.Offset != want {
				t.Fatalf("partition %d: the first record is at %d, the log starts at %d", r.Partition, r.Offset, want)
			}
			next[r.Partition] = r.Offset + 1
		}
		for p := range int32(parts) {
			if idx := slices.Index(before[p], next[p]-1); idx >= 99 {
				n++
			}
		}
	}
	cl.Close()

	// Retention, as consumers run it, until it has nothing more to remove.
	removed := e.retainAll(t)
	after := e.offsetsByPartition()
	first := map[int32]int64{}    // the first retained event's offset
	logStart := map[int32]int64{} // the log start: the end of the last segment removed
	for p := range int32(parts) {
		if len(after[p]) == 0 {
			t.Fatalf("partition %d: retention removed every event", p)
		}
		first[p] = after[p][0]
		lastRemoved := before[p][len(before[p])-len(after[p])-1]
		logStart[p] = (lastRemoved-1)/schema.MinSegmentSize*schema.MinSegmentSize + schema.MinSegmentSize + 1
		if logStart[p] > first[p] {
			t.Fatalf("partition %d: the last offset removed is %d, so the log starts at %d, beyond the first retained event %d", p, lastRemoved, logStart[p], first[p])
		}
		if first[p] <= next[p] {
			t.Fatalf("partition %d: the log starts at %d after retention (%d segments removed), the consumer's position is %d: the test needs the position removed",
				p, first[p], removed, next[p])
		}
		// Retention removes whole segments from the start: what stays is
		// a suffix of the log.
		if !slices.Equal(after[p], before[p][len(before[p])-len(after[p]):]) {
			t.Fatalf("partition %d: the retained offsets are not a suffix of the log", p)
		}
	}

	t.Logf("%d segments removed; log start %v, first retained %v, the consumer's position %v", removed, logStart, first, next)

	// Raw: Fetch at the old position, ListOffsets earliest and latest.
	rc := dialRaw(t, e.addr)
	fetch := kmsg.NewPtrFetchRequest()
	fetch.SetVersion(12)
	fetch.MaxBytes = 1 << 20
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = "events"
	lo := kmsg.NewPtrListOffsetsRequest()
	lo.SetVersion(7)
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = "events"
	for p := range int32(parts) {
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes = p, next[p], 1<<20
		ft.Partitions = append(ft.Partitions, fp)
		for _, ts := range []int64{-2, -1} {
			lp := kmsg.NewListOffsetsRequestTopicPartition()
			lp.Partition, lp.Timestamp = p, ts
			lt.Partitions = append(lt.Partitions, lp)
		}
	}
	fetch.Topics = append(fetch.Topics, ft)
	lo.Topics = append(lo.Topics, lt)
	resp, err := rc.do(fetch)
	if err != nil {
		t.Fatal(err)
	}
	for _, fp := range resp.(*kmsg.FetchResponse).Topics[0].Partitions {
		if fp.ErrorCode != kerr.OffsetOutOfRange.Code || fp.LogStartOffset != logStart[fp.Partition] || len(fp.RecordBatches) != 0 {
			t.Errorf("partition %d: fetch at %d below the log start %d: %v, log start %d, %d bytes of records",
				fp.Partition, next[fp.Partition], logStart[fp.Partition], kerr.ErrorForCode(fp.ErrorCode), fp.LogStartOffset, len(fp.RecordBatches))
		}
	}
	resp, err = rc.do(lo)
	if err != nil {
		t.Fatal(err)
	}
	for i, lp := range resp.(*kmsg.ListOffsetsResponse).Topics[0].Partitions {
		want := logStart[lp.Partition]
		if i%2 == 1 {
			want = slices.Max(after[lp.Partition]) + 1
		}
		if lp.ErrorCode != 0 || lp.Offset != want {
			t.Errorf("partition %d: ListOffsets %s: %d (%v), want %d", lp.Partition, []string{"earliest", "latest"}[i%2], lp.Offset, kerr.ErrorForCode(lp.ErrorCode), want)
		}
	}

	// A consumer resuming at the old positions, reset "start".
	resume := map[string]map[int32]kgo.Offset{"events": {}}
	for p := range int32(parts) {
		resume["events"][p] = kgo.NewOffset().At(next[p])
	}
	cl, err = kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.ConsumePartitions(resume),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[int32][]int64{}
	for n, total := 0, len(after[0])+len(after[1]); n < total; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("the resumed consumer read %d of %d retained events before the deadline", n, total)
		}
		for _, fe := range fs.Errors() {
			t.Fatalf("fetch %s/%d: %v", fe.Topic, fe.Partition, fe.Err)
		}
		for _, r := range fs.Records() {
			var v struct{ I int }
			if err := json.Unmarshal(r.Value, &v); err != nil || v.I == 0 {
				t.Errorf("offset %d: value %s", r.Offset, r.Value)
			}
			got[r.Partition] = append(got[r.Partition], r.Offset)
			n++
		}
	}
	for p := range int32(parts) {
		if !slices.Equal(got[p], after[p]) {
			t.Errorf("partition %d: the resumed consumer read %d events from %v, want the %d retained from %d",
				p, len(got[p]), got[p][:min(3, len(got[p]))], len(after[p]), first[p])
		}
	}
}
