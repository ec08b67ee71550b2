package consumercli

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/offsets"
)

// appendTxs appends n events of host-0..host-(hosts-1) to topic 1, in
// transactions of up to 3 events over several hosts.
func appendTxs(t *testing.T, pool *pgxpool.Pool, n, hosts int) {
	t.Helper()
	ctx := pgtest.Context(context.Background())
	for i := 0; i < n; {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var evs []pgevents.Event
		for j := 0; j < 3 && i < n; j++ {
			evs = append(evs, pgevents.Event{TopicID: 1, HostID: fmt.Sprintf("host-%d", i%hosts), EventType: "t", Payload: []byte(fmt.Sprintf(`{"i": %d}`, i))})
			i++
		}
		if _, err := pgevents.Append(ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// kafkaMember is a kgo member of group g through addr that records every
// record it gets, by (partition, offset), until the test ends or close.
type kafkaMember struct {
	cl   *kgo.Client
	mu   sync.Mutex
	got  map[[2]int64]int
	done chan struct{}
}

func joinKafka(t *testing.T, addr, g string) *kafkaMember {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup(g), kgo.ConsumeTopics("events"),
		kgo.ClientID("kgo-member"), kgo.FetchMaxWait(200*time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }))
	if err != nil {
		t.Fatal(err)
	}
	m := &kafkaMember{cl: cl, got: map[[2]int64]int{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			for _, r := range cl.PollFetches(ctx).Records() {
				m.mu.Lock()
				m.got[[2]int64{int64(r.Partition), r.Offset}]++
				m.mu.Unlock()
			}
		}
	}()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { cancel(); <-m.done; cl.Close() }) })
	return m
}

func (m *kafkaMember) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.got)
}

// holder waits until group g's name is held by a holder whose
// description contains named, or by nobody when named is "".
func holder(t *testing.T, pool *pgxpool.Pool, g, named string) {
	t.Helper()
	pgtest.WaitFor(t, 30*time.Second, fmt.Sprintf("group %s's name held by %q", g, named), func() bool {
		by, err := offsets.GroupHolder(context.Background(), pool, g)
		return err == nil && (named == "" && by == "" || named != "" && strings.Contains(by, named))
	})
}

// TestRunRefusedWhileKafkaMembersLive: `consumer run` for group g while a
// kgo member of the Kafka group g is live (through `consumer kafka`)
// refuses to start, exit 2, naming the groupId key and the member; once
// the member left, it starts and handles what was appended, once.
func TestRunRefusedWhileKafkaMembersLive(t *testing.T) {
	t.Parallel()
	url, pool := migrated(t, 2)
	kp := start(t, url, "kafka", "--config", writeConfig(t, kafkaConfig(2)))
	addr := kafkaListening(t, kp)
	m := joinKafka(t, addr, "g")
	holder(t, pool, "g", "kgo-member")
	cfg := writeConfig(t, recordingConfig(2, -1, 10))
	code, out := runOnce(t, url, "run", "--config", cfg)
	if code != exitUsage || !strings.Contains(out, "groupId") || !strings.Contains(out, "kgo-member") {
		t.Fatalf("consumer run while a Kafka member of its group is live: exit %d, want %d naming groupId and kgo-member:\n%s", code, exitUsage, out)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM consumer_replicas WHERE group_id = 'g'`); n != 0 {
		t.Errorf("the refused consumer left %d replica rows", n)
	}
	m.cl.Close() // leaves the group
	holder(t, pool, "g", "")
	appendTxs(t, pool, 30, 5)
	p := start(t, url, "run", "--config", cfg)
	eventtest.WaitHandled(t, pool, 30, 30*time.Second)
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("consumer run exited %d after SIGTERM", code)
	}
	eventtest.CheckHandled(t, pool)
}

// TestFrozenReplicaYieldsToKafka: a `consumer run` process of group g is
// frozen (SIGSTOP) past its lease; a kgo member of the Kafka group g then
// takes the name and reads the events appended meanwhile, from the
// group's positions. Thawed, the process commits nothing more and stops,
// exit 2, naming the Kafka members: every event is handled by exactly one
// of the two, the process's ones once each.
func TestFrozenReplicaYieldsToKafka(t *testing.T) {
	t.Parallel()
	url, pool := migrated(t, 2)
	kp := start(t, url, "kafka", "--config", writeConfig(t, kafkaConfig(2)))
	addr := kafkaListening(t, kp)
	cfg := writeConfig(t, strings.Replace(recordingConfig(2, -1, 10), "waitPeriodMs: 1000", "waitPeriodMs: 1000\nleaseMs: 1500", 1))
	p := start(t, url, "run", "--config", cfg)
	appendTxs(t, pool, 40, 7)
	eventtest.WaitHandled(t, pool, 40, 30*time.Second)

	p.freeze(t)
	pgtest.WaitFor(t, 30*time.Second, "the frozen replica's lease to expire", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM consumer_replicas WHERE group_id = 'g' AND expires_at > clock_timestamp()`) == 0
	})
	m := joinKafka(t, addr, "g")
	holder(t, pool, "g", "kgo-member")
	appendTxs(t, pool, 40, 7)
	pgtest.WaitFor(t, 60*time.Second, "the kgo member to read the 40 events appended while the replica was frozen", func() bool { return m.count() >= 40 })

	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-p.exitCh:
		if out := p.out.String(); code != exitUsage || !strings.Contains(out, "kgo-member") {
			t.Errorf("the thawed consumer exited %d, want %d naming the Kafka member:\n%s", code, exitUsage, tail(out, 3000))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the thawed consumer did not stop within 30 s")
	}

	// Each of the 80 events handled by exactly one of the two.
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, n := range m.got {
		if n != 1 {
			t.Errorf("the kgo member got partition %d offset %d %d times", k[0], k[1], n)
		}
		if h := eventtest.QueryInt(t, pool, `SELECT count(*) FROM handled WHERE partition_id = $1 AND c_offset = $2`, k[0], k[1]); h != 0 {
			t.Errorf("partition %d offset %d: handled by the replica and by the kgo member", k[0], k[1])
		}
	}
	handled := eventtest.QueryInt(t, pool, `SELECT count(*) FROM handled`)
	dups := eventtest.QueryInt(t, pool, `SELECT count(*) FROM (SELECT partition_id, c_offset FROM handled GROUP BY 1, 2 HAVING count(*) > 1) d`)
	if dups != 0 || handled+int64(len(m.got)) != 80 {
		t.Errorf("the replica handled %d events (%d twice), the kgo member %d: want 80 in all, each once", handled, dups, len(m.got))
	}
}
