package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/pgeventstest"
	"github.com/pgevents/pgevents/schema"
)

// commitRaw sends an OffsetCommit (v8) for group g, as member (generation
// gen) or, with "" and -1, from outside the group protocol as tools do,
// and returns the error code of each partition.
func commitRaw(t *testing.T, rc *rawClient, g, member string, gen int32, next map[int32]int64) map[int32]int16 {
	t.Helper()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.SetVersion(8)
	req.Group, req.MemberID, req.Generation = g, member, gen
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = "events"
	for p, n := range next {
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset = p, n
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := rc.do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int16{}
	for _, tp := range resp.(*kmsg.OffsetCommitResponse).Topics {
		for _, p := range tp.Partitions {
			out[p.Partition] = p.ErrorCode
		}
	}
	return out
}

// fetchCommitted sends an OffsetFetch (v7) for group g's partitions of
// events and returns the committed offsets.
func fetchCommitted(t *testing.T, rc *rawClient, g string, ps ...int32) map[int32]int64 {
	t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.SetVersion(7)
	req.Group = g
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic, rt.Partitions = "events", ps
	req.Topics = append(req.Topics, rt)
	resp, err := rc.do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := resp.(*kmsg.OffsetFetchResponse)
	if r.ErrorCode != 0 {
		t.Fatalf("OffsetFetch of group %s: %v", g, kerr.ErrorForCode(r.ErrorCode))
	}
	out := map[int32]int64{}
	for _, tp := range r.Topics {
		for _, p := range tp.Partitions {
			out[p.Partition] = p.Offset
		}
	}
	return out
}

// positions reads group g's pgevents positions on topic 1 (-1: none).
func (e *env) positions(g string) map[int32]int64 {
	e.t.Helper()
	pos, err := offsets.Positions(e.ctx, e.pool, g, 1, 1)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int32]int64{}
	for _, p := range pos {
		out[int32(p.Partition)] = p.Next
	}
	return out
}

// effects counts the rows the test's handler wrote, and the event ids
// written more than once.
func effects(t *testing.T, e *env) (rows, doubled int) {
	t.Helper()
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*), count(*) - count(DISTINCT event_id) FROM public.effects`).Scan(&rows, &doubled); err != nil {
		t.Fatal(err)
	}
	return rows, doubled
}

// TestGroupNameBelongsToOneKind: group app runs as pgevents replicas (a
// consumer with the production pool settings, whose handler records each
// event it handles in a table). While they are live, a Kafka tool's commit
// for app (generation -1, no member: a reset) is refused with
// UNKNOWN_MEMBER_ID, below the positions and above the log end alike, and
// the positions do not move; a JoinGroup is refused with
// INCONSISTENT_GROUP_PROTOCOL; a kgo member of app gets nothing while the
// replicas handle every new event once. Once the consumer stops, the kgo
// member joins and reads from the pgevents positions: exactly the events
// appended since, none the replicas handled. While it is a member, a tool's
// commit is refused with UNKNOWN_MEMBER_ID and a pgevents consumer of app
// refuses to start (GroupInUseError naming the kgo client). Under each
// scope.
func TestGroupNameBelongsToOneKind(t *testing.T) {
	t.Parallel()
	for _, scope := range allScopes {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			seed := uint64(time.Now().UnixNano())
			e := newLiveEnv(t, 4, scope, kafka.Options{})
			ctx, cancel := context.WithTimeout(e.ctx, 120*time.Second)
			defer cancel()
			if _, err := e.pool.Exec(ctx, `CREATE TABLE public.effects (event_id uuid, host text, payload text)`); err != nil {
				t.Fatal(err)
			}
			hs := &pgevents.Handlers{}
			hs.HandleAll(pgevents.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
				_, err := tx.Exec(ctx, `INSERT INTO public.effects VALUES ($1, $2, $3)`, ev.EventID, ev.HostID, string(ev.Payload))
				return err
			}))
			url := e.pool.Config().ConnString()
			cfg := pgevents.Config{GroupID: "app", TopicID: 1, TotalPartitions: 4, Handlers: hs, Schema: pgtest.Schema()}
			_, stop := pgeventstest.StartConsumer(t, url, cfg)
			want := e.produceRandom(seed, 40, 9)
			n := total(want)
			waitFor(t, 60*time.Second, "the replicas to handle the first events", func() bool { r, _ := effects(t, e); return r == n })
			before := e.positions("app")

			rc := dialRaw(t, e.addr)
			for _, off := range []int64{1, 1 << 40} {
				codes := commitRaw(t, rc, "app", "", -1, map[int32]int64{0: off, 1: off})
				for p, c := range codes {
					if c != kerr.UnknownMemberID.Code {
						t.Errorf("a tool's commit of partition %d to %d while the replicas run: %v, want UNKNOWN_MEMBER_ID", p, off, kerr.ErrorForCode(c))
					}
				}
			}
			if got := e.positions("app"); !maps.Equal(got, before) {
				t.Fatalf("the refused commits moved the positions from %v to %v", before, got)
			}
			join := kmsg.NewPtrJoinGroupRequest()
			join.SetVersion(5)
			join.Group, join.SessionTimeoutMillis, join.RebalanceTimeoutMillis, join.ProtocolType = "app", 10000, 10000, "consumer"
			join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range"}}
			resp, err := rc.do(join)
			if err != nil {
				t.Fatal(err)
			}
			if c := resp.(*kmsg.JoinGroupResponse).ErrorCode; c != kerr.InconsistentGroupProtocol.Code {
				t.Errorf("JoinGroup of app while the replicas run: %v, want INCONSISTENT_GROUP_PROTOCOL", kerr.ErrorForCode(c))
			}

			// A kgo member of app, refused while the replicas run.
			got := newSeen()
			var (
				mu      sync.Mutex
				refused bool
			)
			cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.ConsumerGroup("app"), kgo.ConsumeTopics("events"),
				kgo.ClientID("kgo-member"), kgo.FetchMaxWait(200*time.Millisecond),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					fs := cl.PollFetches(ctx)
					for _, fe := range fs.Errors() {
						if errors.Is(fe.Err, kerr.InconsistentGroupProtocol) {
							mu.Lock()
							refused = true
							mu.Unlock()
						}
					}
					for _, r := range fs.Records() {
						got.add("kgo", r)
					}
				}
			}()
			defer wg.Wait()
			defer cancel()
			waitFor(t, 30*time.Second, "the kgo member to be refused", func() bool { mu.Lock(); defer mu.Unlock(); return refused })
			more := e.produceRandom(seed+1, 20, 9)
			for h, w := range more {
				want[h] = append(want[h], w...)
			}
			n = total(want)
			waitFor(t, 60*time.Second, "the replicas to handle the new events", func() bool { r, _ := effects(t, e); return r == n })
			if c := got.count(); c != 0 {
				t.Fatalf("the kgo member got %d records while the replicas ran (seed %d)", c, seed)
			}

			// The replicas stop: the member joins, from their positions.
			stop()
			last := e.produceRandom(seed+2, 20, 9)
			waitFor(t, 60*time.Second, fmt.Sprintf("the kgo member to read the %d events appended after the replicas stopped", total(last)),
				func() bool { return got.count() >= total(last) })
			got.check(t, last, seed)
			if rows, doubled := effects(t, e); rows != n || doubled != 0 {
				t.Errorf("the replicas' handler wrote %d rows (%d events twice), want %d, once each (seed %d)", rows, doubled, n, seed)
			}

			// Now the name is the Kafka group's: a tool's commit is refused
			// as Kafka refuses a non-member's commit to a group with members,
			// and a replica refuses to start.
			for p, c := range commitRaw(t, rc, "app", "", -1, map[int32]int64{0: 1}) {
				if c != kerr.UnknownMemberID.Code {
					t.Errorf("a tool's commit of partition %d while a kgo member is live: %v, want UNKNOWN_MEMBER_ID", p, kerr.ErrorForCode(c))
				}
			}
			c, err := pgevents.NewConsumer(e.pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
			defer rcancel()
			err = c.Run(rctx)
			var inUse *pgevents.GroupInUseError
			if !errors.As(err, &inUse) || !strings.Contains(err.Error(), "kgo-member") {
				t.Errorf("a pgevents consumer of app started while a kgo member is live: %v, want a GroupInUseError naming kgo-member", err)
			}
		})
	}
}

// TestToolCommitsAsABroker: commits from outside a group's membership, as
// kafka-consumer-groups --reset-offsets sends them, to a group nobody
// consumes. A negative offset is taken (error 0, never a retriable error
// that fails again) and leaves the partition with no committed offset
// (OffsetFetch -1; a member then applies its auto.offset.reset), offset 0
// is taken as 1, the first offset a partition can have, and an offset
// above the log end is taken as a broker takes it. Each such commit is an
// operator's action: a console_audit row of origin kafka names the SASL
// user and the positions moved. A kgo member of the group with reset
// "start" then reads partition 0 from its start, partition 1 from 1 and
// partition 2 from the offset committed; partition 3, committed above the
// log end, is refused OFFSET_OUT_OF_RANGE and reset to the start. A tool's
// commit to a stopped pgevents group keeps its subscription's settings.
func TestToolCommitsAsABroker(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	e := newEnv(t, 4, schema.ScopePartition, kafka.Options{Users: map[string]string{"ops": "secret"}})
	e.produceRandom(seed, 60, 16)
	log := e.offsetsByPartition()
	for p := range int32(4) {
		if len(log[p]) < 3 {
			t.Fatalf("partition %d holds %d events; the test needs 3 (seed %d)", p, len(log[p]), seed)
		}
	}
	rc := dialRaw(t, e.addr)
	rc.saslPlain(t, "", "ops", "secret")
	commits := []map[int32]int64{
		{0: 3, 1: 3, 2: 3, 3: 3},                         // subscribes the group
		{0: -1, 1: 0, 2: log[2][2], 3: log[3][2] + 1000}, // the reset
	}
	for _, c := range commits {
		for p, code := range commitRaw(t, rc, "tool", "", -1, c) {
			if code != 0 {
				t.Fatalf("commit of partition %d to %d: %v, want it taken", p, c[p], kerr.ErrorForCode(code))
			}
		}
	}
	got := fetchCommitted(t, rc, "tool", 0, 1, 2, 3)
	if want := map[int32]int64{0: -1, 1: 1, 2: log[2][2], 3: log[3][2] + 1000}; !maps.Equal(got, want) {
		t.Errorf("OffsetFetch after the reset: %v, want %v", got, want)
	}
	var (
		origin, actor, detail string
		rows                  int
	)
	if err := e.pool.QueryRow(e.ctx, schema.SQL(e.ctx, `SELECT count(*) OVER (), origin, actor, detail FROM {schema}console_audit
WHERE group_id = 'tool' AND action = 'reset' ORDER BY id DESC LIMIT 1`)).Scan(&rows, &origin, &actor, &detail); err != nil {
		t.Fatal(err)
	}
	wantDetail := fmt.Sprintf("partition 0: 3 -> none, partition 1: 3 -> 1, partition 2: 3 -> %d, partition 3: 3 -> %d", log[2][2], log[3][2]+1000)
	if rows != 2 || origin != offsets.OriginKafka || actor != "user ops (client raw)" || detail != wantDetail {
		t.Errorf("audit: %d rows, the last %q by %q: %q; want 2, kafka, user ops (client raw), %q", rows, origin, actor, detail, wantDetail)
	}

	// A tool's commit to a stopped pgevents group moves its positions and
	// keeps its subscription's settings (its dead_after, not a Kafka
	// group's minute).
	if _, err := offsets.Subscribe(e.ctx, e.pool, "pg", 1, offsets.Start{Kind: offsets.Earliest}, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	if c := commitRaw(t, rc, "pg", "", -1, map[int32]int64{0: 2})[0]; c != 0 {
		t.Fatalf("a tool's commit to a stopped pgevents group: %v", kerr.ErrorForCode(c))
	}
	var deadAfter string
	if err := e.pool.QueryRow(e.ctx, schema.SQL(e.ctx, `SELECT dead_after::text FROM {schema}subscriptions WHERE group_id = 'pg'`)).Scan(&deadAfter); err != nil || deadAfter != "02:00:00" {
		t.Errorf("a tool's commit left the pgevents group's dead_after at %q (%v), want its own 02:00:00", deadAfter, err)
	}

	s := newSeen()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.ConsumerGroup("tool"), kgo.ConsumeTopics("events"),
		kgo.SASL(plainAuth("ops", "secret")), kgo.FetchMaxWait(200*time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	first := map[int32]int64{}
	wantN := len(log[0]) + len(log[1]) + len(log[2]) - 2 + len(log[3])
	for s.count() < wantN && ctx.Err() == nil {
		for _, r := range cl.PollFetches(ctx).Records() {
			if _, ok := first[r.Partition]; !ok {
				first[r.Partition] = r.Offset
			}
			s.add("kgo", r)
		}
	}
	if want := map[int32]int64{0: 1, 1: 1, 2: log[2][2], 3: 1}; !maps.Equal(first, want) {
		t.Errorf("the member read partitions from %v, want %v (seed %d)", first, want, seed)
	}
	if s.count() != wantN {
		t.Errorf("the member read %d records, want %d (seed %d)", s.count(), wantN, seed)
	}
}
