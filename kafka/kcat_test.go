package kafka_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/schema"
)

// EnvKcat names the environment variable that gives the kcat executable
// of the kcat tests; by default they look for kcat (or its former name,
// kafkacat) on the PATH.
const EnvKcat = "PGEVENTS_KCAT"

// kcat returns the kcat executable, or fails the test saying how to
// install it.
func kcat(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvKcat); p != "" {
		return p
	}
	for _, name := range []string{"kcat", "kafkacat"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("no kcat for the librdkafka client tests: install Debian's kcat (sudo apt-get install -y kcat; .ci/run does) "+
		"or set %s to a kcat executable", EnvKcat)
	return ""
}

// scopes are the scopes the client tests run in: topic (a partition's
// offsets have gaps, as a compacted topic's do) and partition (dense
// offsets).
var scopes = []string{schema.ScopeTopic, schema.ScopePartition}

// kcatMessage is one message as kcat -J prints it.
type kcatMessage struct {
	Topic     string   `json:"topic"`
	Partition int32    `json:"partition"`
	Offset    int64    `json:"offset"`
	Headers   []string `json:"headers"`
	Key       *string  `json:"key"`
	Payload   *string  `json:"payload"`
}

// record returns m as a kgo record, for seen.
func (m kcatMessage) record() *kgo.Record {
	r := &kgo.Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
	if m.Key != nil {
		r.Key = []byte(*m.Key)
	}
	if m.Payload != nil {
		r.Value = []byte(*m.Payload)
	}
	for i := 0; i+1 < len(m.Headers); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: m.Headers[i], Value: []byte(m.Headers[i+1])})
	}
	return r
}

// kcatProc is a running kcat: each line it prints on stdout goes to
// onLine; its stderr is kept for failure messages.
type kcatProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr logtest.Buffer
	lines  sync.WaitGroup
	mu     sync.Mutex
	bad    []string // lines that are not JSON messages
}

// startKcat starts kcat with args; every message it prints with -J is
// given to onMessage, from one goroutine, in the order printed. stdin is
// the process's standard input (nil: none).
func startKcat(ctx context.Context, t *testing.T, stdin io.Reader, onMessage func(kcatMessage), args ...string) *kcatProc {
	t.Helper()
	p := &kcatProc{t: t, cmd: exec.CommandContext(ctx, kcat(t), args...)}
	p.cmd.Stdin = stdin
	p.cmd.Stderr = &p.stderr
	p.cmd.WaitDelay = 10 * time.Second
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("kcat %s: %v", strings.Join(args, " "), err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kcat %s: stderr:\n%s", strings.Join(args, " "), p.stderr.String())
		}
	})
	p.lines.Add(1)
	go func() {
		defer p.lines.Done()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m kcatMessage
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				p.mu.Lock()
				p.bad = append(p.bad, sc.Text())
				p.mu.Unlock()
				continue
			}
			if onMessage != nil {
				onMessage(m)
			}
		}
	}()
	return p
}

// wait waits for kcat to exit and fails the test unless it exited with
// status 0 and printed only messages.
func (p *kcatProc) wait() {
	p.t.Helper()
	p.lines.Wait()
	err := p.cmd.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.t.Fatalf("kcat %s: %v; stderr:\n%s", strings.Join(p.cmd.Args[1:], " "), err, p.stderr.String())
	}
	if len(p.bad) > 0 {
		p.t.Fatalf("kcat %s printed lines that are not messages: %q", strings.Join(p.cmd.Args[1:], " "), p.bad)
	}
}

// logRows reads topic 1's events by partition and offset.
func (e *env) logRows() map[[2]int64]logRow {
	e.t.Helper()
	out := map[[2]int64]logRow{}
	for _, r := range e.readLog() {
		out[[2]int64{int64(r.partition), r.offset}] = r
	}
	return out
}

// checkAgainstLog checks that each message is the event of its partition
// and offset in the database: key, value and headers.
func checkAgainstLog(t *testing.T, log map[[2]int64]logRow, msgs []kcatMessage, seed uint64) {
	t.Helper()
	for _, m := range msgs {
		r, ok := log[[2]int64{int64(m.Partition), m.Offset}]
		if !ok {
			t.Errorf("partition %d offset %d: no such event in the log (seed %d)", m.Partition, m.Offset, seed)
			continue
		}
		hs := map[string]string{}
		for i := 0; i+1 < len(m.Headers); i += 2 {
			hs[m.Headers[i]] = m.Headers[i+1]
		}
		wantHs := map[string]string{kafka.HeaderEventType: r.eventType, kafka.HeaderEventID: r.eventID, kafka.HeaderTransactionID: fmt.Sprint(r.txid)}
		switch {
		case m.Key == nil || *m.Key != r.host:
			t.Errorf("partition %d offset %d: key %v, want the host %q (seed %d)", m.Partition, m.Offset, m.Key, r.host, seed)
		case m.Payload == nil || *m.Payload != r.payload:
			t.Errorf("partition %d offset %d: value %v, want the payload %q (seed %d)", m.Partition, m.Offset, m.Payload, r.payload, seed)
		case !maps.Equal(hs, wantHs):
			t.Errorf("partition %d offset %d: headers %v, want %v (seed %d)", m.Partition, m.Offset, hs, wantHs, seed)
		}
	}
}

// hasGaps reports whether some partition's offsets in log are not
// consecutive.
func hasGaps(log map[[2]int64]logRow) bool {
	byPartition := map[int64][]int64{}
	for k := range log {
		byPartition[k[0]] = append(byPartition[k[0]], k[1])
	}
	for _, offs := range byPartition {
		slices.Sort(offs)
		for i := 1; i < len(offs); i++ {
			if offs[i] != offs[i-1]+1 {
				return true
			}
		}
	}
	return false
}

// kcatRead reads the whole topic with kcat in simple-consumer mode (-C,
// from the beginning, exiting at the end of every partition) and returns
// what it printed.
func kcatRead(ctx context.Context, t *testing.T, addr string) []kcatMessage {
	t.Helper()
	var msgs []kcatMessage
	p := startKcat(ctx, t, nil, func(m kcatMessage) { msgs = append(msgs, m) },
		"-C", "-b", addr, "-t", "events", "-o", "beginning", "-e", "-q", "-J")
	p.wait()
	return msgs
}

// TestKcatReadsLog: kcat (librdkafka) in simple-consumer mode reads a
// topic written by multi-event transactions over several hosts, a third
// rolled back: every committed event exactly once, in offset order per
// partition and append order per host, nothing of a rolled-back
// transaction, each record being the event of its partition and offset
// (key the host, value the payload, the event's headers). In scope topic
// a partition's offsets have gaps, which librdkafka must step over.
func TestKcatReadsLog(t *testing.T) {
	t.Parallel()
	for _, scope := range scopes {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			seed := uint64(time.Now().UnixNano())
			e := newEnv(t, 4, scope, kafka.Options{})
			want := e.produceRandom(seed, 80, 7)
			log := e.logRows()
			if scope == schema.ScopeTopic && !hasGaps(log) {
				t.Fatalf("scope topic: no partition has a gap in its offsets; the test does not exercise gaps (seed %d)", seed)
			}
			ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
			defer cancel()
			msgs := kcatRead(ctx, t, e.addr)
			s := newSeen()
			for _, m := range msgs {
				s.add("kcat", m.record())
			}
			s.check(t, want, seed)
			checkAgainstLog(t, log, msgs, seed)
			if len(msgs) != len(log) {
				t.Errorf("kcat printed %d messages, the log holds %d events (seed %d)", len(msgs), len(log), seed)
			}
		})
	}
}

// checkPositions checks that group g's pgevents positions are the offsets
// after the last handled in each partition s saw.
func checkPositions(t *testing.T, e *env, g string, s *seen, seed uint64) {
	t.Helper()
	pos, err := offsets.Positions(e.ctx, e.pool, g, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	next := map[int32]int64{}
	for _, p := range pos {
		next[int32(p.Partition)] = p.Next
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, last := range s.last {
		if n, ok := next[p]; !ok || n != last+1 {
			t.Errorf("group %s partition %d: pgevents position %d (present %v), want %d, after the last offset handled (seed %d)", g, p, n, ok, last+1, seed)
		}
	}
}

// TestKcatGroup: kcat (librdkafka) as a balanced consumer of group grp
// reads every committed event once and commits; the group's committed
// offsets are the pgevents group's positions. A second run in the group,
// after more transactions, reads exactly the new events, and its commit
// on SIGTERM moves the positions on.
func TestKcatGroup(t *testing.T) {
	t.Parallel()
	for _, scope := range scopes {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			seed := uint64(time.Now().UnixNano())
			e := newEnv(t, 4, scope, kafka.Options{})
			want := e.produceRandom(seed, 80, 7)
			ctx, cancel := context.WithTimeout(e.ctx, 90*time.Second)
			defer cancel()
			// -u: unbuffered, each message is printed as it comes. librdkafka
			// commits the offsets kcat handled every auto.commit.interval.ms
			// and when the consumer closes: with an interval longer than the
			// test, the commits checked are the ones on close.
			group := func(extra ...string) []string {
				return append([]string{"-b", e.addr, "-G", "grp", "-J", "-u",
					"-X", "auto.offset.reset=earliest", "-X", "auto.commit.interval.ms=600000"}, append(extra, "events")...)
			}

			// First run: -e, it exits once every assigned partition is at its
			// end, committing on close.
			s := newSeen()
			p := startKcat(ctx, t, nil, func(m kcatMessage) { s.add("kcat", m.record()) }, group("-e")...)
			p.wait()
			s.check(t, want, seed)
			checkPositions(t, e, "grp", s, seed)
			if t.Failed() {
				return
			}

			// Second run, after more transactions: only the new events; stopped
			// with SIGTERM once they came, it commits as it closes.
			want2 := e.produceRandom(seed+1, 30, 7)
			n2 := total(want2)
			s2 := newSeen()
			p = startKcat(ctx, t, nil, func(m kcatMessage) { s2.add("kcat", m.record()) }, group()...)
			waitFor(t, 60*time.Second, fmt.Sprintf("kcat's second run to print %d messages (seed %d)", n2, seed), func() bool { return s2.count() >= n2 })
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			p.wait()
			s2.check(t, want2, seed)
			checkPositions(t, e, "grp", s2, seed)
		})
	}
}

// TestKcatProduce: kcat (librdkafka) produces "host:json" lines with -K:
// (values holding the delimiter too); each becomes one event whose
// host_id is the key and payload the value, in the partition pgevents
// chooses for the host, in line order per host. kcat then reads them back
// as they are in the log.
func TestKcatProduce(t *testing.T) {
	t.Parallel()
	for _, scope := range scopes {
		for _, idempotent := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/idempotent=%v", scope, idempotent), func(t *testing.T) {
				t.Parallel()
				seed := uint64(time.Now().UnixNano())
				r := rand.New(rand.NewPCG(seed, 11))
				e := newEnv(t, 4, scope, kafka.Options{})
				want := map[string][]string{}
				var in strings.Builder
				for i := range 150 {
					h := fmt.Sprintf("host-%d", r.IntN(7))
					v := fmt.Sprintf(`{"i": %d, "s": "a:%d"}`, i, r.IntN(1000)) // jsonb's own text form
					fmt.Fprintf(&in, "%s:%s\n", h, v)
					want[h] = append(want[h], v)
				}
				ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
				defer cancel()
				p := startKcat(ctx, t, strings.NewReader(in.String()), nil,
					"-P", "-b", e.addr, "-t", "events", "-K:", "-X", fmt.Sprintf("enable.idempotence=%v", idempotent))
				p.wait()

				// The log: each line once, its host the key, in line order per
				// host, every host in one partition.
				rows, err := e.pool.Query(e.ctx, schema.SQL(e.ctx, `SELECT host_id, partition_id, payload::text, event_type
FROM {schema}outbox_message_t WHERE topic_id = 1 ORDER BY partition_id, c_offset`))
				if err != nil {
					t.Fatal(err)
				}
				got := map[string][]string{}
				parts := map[string]map[int]bool{}
				for rows.Next() {
					var (
						h, payload, typ string
						part            int
					)
					if err := rows.Scan(&h, &part, &payload, &typ); err != nil {
						t.Fatal(err)
					}
					if typ != "kafka" {
						t.Errorf("host %s: event type %q, want kafka (seed %d)", h, typ, seed)
					}
					got[h] = append(got[h], payload)
					if parts[h] == nil {
						parts[h] = map[int]bool{}
					}
					parts[h][part] = true
				}
				if err := rows.Err(); err != nil {
					t.Fatal(err)
				}
				for h, w := range want {
					if !slices.Equal(got[h], w) {
						t.Errorf("host %s: the log holds %d events %v, want %d %v (seed %d)", h, len(got[h]), got[h], len(w), w, seed)
					}
					if len(parts[h]) != 1 {
						t.Errorf("host %s: events in partitions %v, want one (seed %d)", h, parts[h], seed)
					}
				}
				for h := range got {
					if want[h] == nil {
						t.Errorf("host %s: in the log, but kcat produced nothing for it (seed %d)", h, seed)
					}
				}

				// Read back with kcat.
				msgs := kcatRead(ctx, t, e.addr)
				s := newSeen()
				for _, m := range msgs {
					s.add("kcat", m.record())
				}
				s.check(t, want, seed)
				checkAgainstLog(t, e.logRows(), msgs, seed)
			})
		}
	}
}
