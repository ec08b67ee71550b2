package kafka_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/schema"
)

// logRow is one event of topic 1 as the log holds it.
type logRow struct {
	offset    int64
	partition int32
	host      string
	user      string
	eventType string
	eventID   string
	txid      int64
	payload   string // "" for none
	metadata  string // "" for none
}

// readLog reads topic 1's events in offset order.
func (e *env) readLog() []logRow {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, schema.SQL(e.ctx, `SELECT c_offset, partition_id, host_id, user_id, event_type, event_id::text,
       transaction_id, coalesce(payload::text, ''), coalesce(metadata::text, '')
FROM {schema}outbox_message_t WHERE topic_id = 1 ORDER BY c_offset, partition_id`))
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []logRow
	for rows.Next() {
		var r logRow
		if err := rows.Scan(&r.offset, &r.partition, &r.host, &r.user, &r.eventType, &r.eventID, &r.txid, &r.payload, &r.metadata); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// countLog counts topic 1's events.
func (e *env) countLog() int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// partitionOf is the partition pgevents gives host in a topic of n
// partitions.
func (e *env) partitionOf(host string, n int) int32 {
	e.t.Helper()
	var p int32
	if err := e.pool.QueryRow(e.ctx, `SELECT event_partition($1, $2)`, host, n).Scan(&p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// produced is what a test produced as one record: its value's fields
// (jsonb's text form is {"h": host, "i": index}), and its headers.
type producedRec struct {
	host      string
	i         int
	eventType string
	user      string
	trace     string
}

func (p producedRec) value() string { return fmt.Sprintf(`{"h": %q, "i": %d}`, p.host, p.i) }

func (p producedRec) record() *kgo.Record {
	r := &kgo.Record{Topic: "events", Key: []byte(p.host), Value: []byte(p.value())}
	if p.eventType != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: kafka.HeaderEventType, Value: []byte(p.eventType)})
	}
	if p.user != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: kafka.HeaderUserID, Value: []byte(p.user)})
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: "trace", Value: []byte(p.trace)})
	return r
}

// randomRecords draws n records over hosts host-0..host-(hosts-1), from
// seed: a third without event_type header (the type is then "kafka"), a
// half with a user_id header, all with a custom header trace.
func randomRecords(seed uint64, n, hosts int) []producedRec {
	r := rand.New(rand.NewPCG(seed, 11))
	types := []string{"", "order.created", "order.paid"}
	out := make([]producedRec, n)
	for i := range out {
		h := fmt.Sprintf("host-%d", r.IntN(hosts))
		out[i] = producedRec{host: h, i: i, eventType: types[r.IntN(3)], trace: fmt.Sprintf("t-%d-%d", seed%1000, i)}
		if r.IntN(2) == 0 {
			out[i].user = "user-" + h
		}
	}
	return out
}

// checkLanded checks that the log of a topic of n partitions holds every
// record of want exactly once and nothing else: the key as host_id, the
// value as payload, the headers as type, user and metadata; every event of
// a host in the partition pgevents computes for it; each host's events in
// the order produced.
func (e *env) checkLanded(want []producedRec, n int, seed uint64) {
	e.t.Helper()
	got := e.readLog()
	if len(got) != len(want) {
		e.t.Errorf("the log holds %d events, %d records were produced (seed %d)", len(got), len(want), seed)
	}
	seen := map[int]int{}
	byHost := map[string][]int{}
	parts := map[string]int32{}
	for _, r := range got {
		var v struct {
			H string `json:"h"`
			I int    `json:"i"`
		}
		if err := json.Unmarshal([]byte(r.payload), &v); err != nil || v.I < 0 || v.I >= len(want) {
			e.t.Errorf("offset %d: payload %q is none of the records produced (seed %d)", r.offset, r.payload, seed)
			continue
		}
		seen[v.I]++
		if seen[v.I] > 1 {
			e.t.Errorf("record %d is in the log %d times (offset %d) (seed %d)", v.I, seen[v.I], r.offset, seed)
			continue
		}
		w := want[v.I]
		wantType := w.eventType
		if wantType == "" {
			wantType = "kafka"
		}
		wantMD := fmt.Sprintf(`{"trace": %q}`, w.trace)
		if r.host != w.host || r.payload != w.value() || r.eventType != wantType || r.user != w.user || r.metadata != wantMD {
			e.t.Errorf("record %d: logged as host %q payload %s type %q user %q metadata %s; want %q %s %q %q %s (seed %d)",
				v.I, r.host, r.payload, r.eventType, r.user, r.metadata, w.host, w.value(), wantType, w.user, wantMD, seed)
		}
		byHost[r.host] = append(byHost[r.host], v.I)
		if p, ok := parts[r.host]; ok && p != r.partition {
			e.t.Errorf("host %s has events in partitions %d and %d (seed %d)", r.host, p, r.partition, seed)
		}
		parts[r.host] = r.partition
	}
	for i := range want {
		if seen[i] == 0 {
			e.t.Errorf("record %d (host %s) is not in the log (seed %d)", i, want[i].host, seed)
		}
	}
	for h, p := range parts {
		if w := e.partitionOf(h, n); p != w {
			e.t.Errorf("host %s: its events are in partition %d, pgevents computes %d (seed %d)", h, p, w, seed)
		}
	}
	for h, is := range byHost {
		if !slices.IsSorted(is) {
			e.t.Errorf("host %s: records in log order %v, not in the order produced (seed %d)", h, is, seed)
		}
	}
}

// produceAll produces recs with cl, one Produce call per record in order
// (kgo keeps a partition's order, and a key always goes to one partition),
// and waits for every answer; it fails the test on the first error.
func produceAll(ctx context.Context, t *testing.T, cl *kgo.Client, recs []producedRec, seed uint64) {
	t.Helper()
	var (
		mu   sync.Mutex
		errs []error
	)
	for _, p := range recs {
		cl.Produce(ctx, p.record(), func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatalf("flush: %v (seed %d)", err, seed)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 {
		t.Fatalf("%d records failed, first: %v (seed %d)", len(errs), errs[0], seed)
	}
}

// TestKgoProduceLandsOnce: a kgo producer with its defaults (idempotent,
// acks all) produces records over several hosts with JSON values and
// headers, under each compression codec. Every record is in the log
// exactly once, as the event its key, value and headers make, in the
// partition pgevents computes for its key, each key's records in the order
// produced.
func TestKgoProduceLandsOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		codec []kgo.CompressionCodec // nil: kgo's default, snappy
	}{
		{"default", nil},
		{"none", []kgo.CompressionCodec{kgo.NoCompression()}},
		{"gzip", []kgo.CompressionCodec{kgo.GzipCompression()}},
		{"lz4", []kgo.CompressionCodec{kgo.Lz4Compression()}},
		{"zstd", []kgo.CompressionCodec{kgo.ZstdCompression()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			seed := uint64(time.Now().UnixNano())
			e := newEnv(t, 4, "", kafka.Options{})
			opts := []kgo.Opt{kgo.SeedBrokers(e.addr)}
			if tc.codec != nil {
				opts = append(opts, kgo.ProducerBatchCompression(tc.codec...))
			}
			cl, err := kgo.NewClient(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
			defer cancel()
			want := randomRecords(seed, 400, 9)
			produceAll(ctx, t, cl, want, seed)
			e.checkLanded(want, 4, seed)
		})
	}
}

// TestProduceDecompresses: a batch compressed with each codec kgo knows,
// sent as it is, lands as its records.
func TestProduceDecompresses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, "", kafka.Options{})
	rc := dialRaw(t, e.addr)
	codecs := []kgo.CompressionCodec{kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression()}
	var want []string
	for c, codec := range codecs {
		var recs []rec
		for i := range 50 {
			v := fmt.Sprintf(`{"c": %d, "i": %d, "pad": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}`, c, i)
			recs = append(recs, rec{key: []byte("h"), value: []byte(v)})
			want = append(want, v)
		}
		resp, err := rc.do(produceRequest(9, "events", map[int32][]byte{0: encodeBatch(t, -1, 0, &codec, recs...)}))
		if err != nil {
			t.Fatal(err)
		}
		if code := resp.(*kmsg.ProduceResponse).Topics[0].Partitions[0].ErrorCode; code != 0 {
			t.Fatalf("codec %d: %v", c, kerr.ErrorForCode(code))
		}
	}
	var got []string
	for _, r := range e.readLog() {
		got = append(got, r.payload)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("log holds %d payloads %v, want %d", len(got), got, len(want))
	}
}

// answerDropper is a TCP proxy in front of the endpoint that loses the
// answers of the first drops Produce requests: it forwards such a request,
// waits for its answer and, instead of passing it on, closes both sides.
// The request was served; the client cannot know it. With atOnce, it
// closes both sides as soon as it has forwarded the request: the endpoint
// serves it while the client sends it again on another connection.
type answerDropper struct {
	ln      net.Listener
	target  string
	atOnce  bool
	drops   atomic.Int32 // Produce answers still to lose
	dropped atomic.Int32
}

func startDropper(t *testing.T, target string, drops int, atOnce bool) *answerDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &answerDropper{ln: ln, target: target, atOnce: atOnce}
	d.drops.Store(int32(drops))
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.serve(c)
			}()
		}
	}()
	return d
}

func (d *answerDropper) serve(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", d.target)
	if err != nil {
		return
	}
	defer s.Close()
	var (
		mu     sync.Mutex
		doomed = map[int32]bool{} // correlation ids whose answer is lost
	)
	go func() {
		defer s.Close()
		for {
			frame, err := readFrame(c)
			if err != nil {
				return
			}
			key := int16(binary.BigEndian.Uint16(frame[4:]))
			corr := int32(binary.BigEndian.Uint32(frame[8:]))
			lose := key == 0 && d.drops.Add(-1) >= 0
			if lose {
				// Marked before it is forwarded: its answer comes after.
				mu.Lock()
				doomed[corr] = true
				mu.Unlock()
			}
			if _, err := s.Write(frame); err != nil {
				return
			}
			if lose && d.atOnce {
				d.dropped.Add(1)
				c.Close()
				return
			}
		}
	}()
	for {
		frame, err := readFrame(s)
		if err != nil {
			return
		}
		corr := int32(binary.BigEndian.Uint32(frame[4:]))
		mu.Lock()
		lose := doomed[corr]
		mu.Unlock()
		if lose {
			d.dropped.Add(1)
			return // closes both sides
		}
		if _, err := c.Write(frame); err != nil {
			return
		}
	}
}

// readFrame reads one size-prefixed frame, the size included.
func readFrame(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n < 8 || n > 64<<20 {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	frame := make([]byte, 4+n)
	copy(frame, size[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}

// TestKgoProduceRetriedAfterLostAnswer: the answers of the first Produce
// requests are lost after the endpoint appended their records (a proxy
// closes the connection instead of passing them on), or the connection is
// closed as soon as a request is forwarded, so that the batch sent again
// races with the first one. kgo sends the batches again, with the same
// producer id and sequence numbers; the idempotency keys make the second
// append a no-op. kgo reports success, and every record is in the log
// exactly once, in the order produced; also to a sequenced topic, whose
// appends take no lock.
func TestKgoProduceRetriedAfterLostAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		scope  string
		atOnce bool
	}{
		{"answer lost", "", false},
		{"connection cut", "", true},
		{"sequenced, answer lost", schema.ScopeSequenced, false},
		{"sequenced, connection cut", schema.ScopeSequenced, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			seed := uint64(time.Now().UnixNano())
			e := newEnv(t, 4, tc.scope, kafka.Options{})
			ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
			defer cancel()
			if tc.scope == schema.ScopeSequenced {
				e.sequence(ctx)
			}
			const rounds, drops = 3, 3
			d := startDropper(t, e.addr, drops, tc.atOnce)
			cl, err := kgo.NewClient(kgo.SeedBrokers(d.ln.Addr().String()),
				kgo.Dialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
					var nd net.Dialer
					return nd.DialContext(ctx, network, d.ln.Addr().String()) // every broker through the proxy
				}),
				kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }),
				kgo.MetadataMinAge(50*time.Millisecond)) // a retry waits for a metadata refresh
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			want := randomRecords(seed, 300, 7)
			// A batch sent again is a Produce request too: the first batch
			// and its retries may take every lost answer, and the later
			// rounds none.
			for r := range rounds {
				produceAll(ctx, t, cl, want[r*100:(r+1)*100], seed)
			}
			if n := d.dropped.Load(); n != drops {
				t.Fatalf("the proxy lost %d answers, want %d: the test did not exercise a retry", n, drops)
			}
			waitFor(t, 30*time.Second, "every record in the log", func() bool { return e.countLog() >= len(want) })
			e.checkLanded(want, 4, seed)
		})
	}
}

// TestProduceIdempotentBatches: a batch of an idempotent producer sent
// again appends nothing, and its answer gives the first append's offset;
// records are told apart by producer, partition asked and their place in
// the batch from its first sequence number (whatever offset deltas the
// client wrote), also when one partition's data holds batches of two
// producers.
func TestProduceIdempotentBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, "", kafka.Options{})
	rc := dialRaw(t, e.addr)
	v := func(s string) rec { return rec{key: []byte("k"), value: []byte(fmt.Sprintf("%q", s))} }
	send := func(batches ...[]byte) *kmsg.ProduceResponseTopicPartition {
		t.Helper()
		resp, err := rc.do(produceRequest(9, "events", map[int32][]byte{0: slices.Concat(batches...)}))
		if err != nil {
			t.Fatal(err)
		}
		p := &resp.(*kmsg.ProduceResponse).Topics[0].Partitions[0]
		if p.ErrorCode != 0 {
			t.Fatalf("produce: %v", kerr.ErrorForCode(p.ErrorCode))
		}
		return p
	}
	first := send(encodeBatch(t, 7, 0, nil, v("a0"), v("a1")))
	again := send(encodeBatch(t, 7, 0, nil, v("a0"), v("a1")))
	if first.BaseOffset < 0 || again.BaseOffset != first.BaseOffset {
		t.Errorf("a batch sent again answered base offset %d, the first %d", again.BaseOffset, first.BaseOffset)
	}
	// Offset deltas all 0: still three sequence numbers.
	send(encodeBatchDeltas(t, 7, 2, nil, []int32{0, 0, 0}, v("a2"), v("a3"), v("a4")))
	// Two producers' batches with the same sequence numbers in one
	// partition's data.
	send(encodeBatch(t, 8, 0, nil, v("b0")), encodeBatch(t, 9, 0, nil, v("c0")))
	// Sequence numbers wrap after MaxInt32.
	send(encodeBatch(t, 10, math.MaxInt32, nil, v("d-max"), v("d0")))
	send(encodeBatch(t, 10, math.MaxInt32, nil, v("d-max"), v("d0")))
	var got []string
	for _, r := range e.readLog() {
		got = append(got, r.payload)
	}
	want := []string{`"a0"`, `"a1"`, `"a2"`, `"a3"`, `"a4"`, `"b0"`, `"c0"`, `"d-max"`, `"d0"`}
	if !slices.Equal(got, want) {
		t.Fatalf("log holds %v, want %v", got, want)
	}
}

// TestKgoProduceErrors: what kgo reports for records the endpoint refuses,
// and a topic it does not serve; nothing is appended.
func TestKgoProduceErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, "", kafka.Options{})
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		r    *kgo.Record
		want error
	}{
		{"no key", &kgo.Record{Topic: "events", Value: []byte(`{}`)}, kerr.InvalidRecord},
		{"value not JSON", &kgo.Record{Topic: "events", Key: []byte("k"), Value: []byte(`not json`)}, kerr.InvalidRecord},
		{"unknown topic", &kgo.Record{Topic: "nope", Key: []byte("k"), Value: []byte(`{}`)}, kerr.UnknownTopicOrPartition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.UnknownTopicRetries(1), kgo.RecordRetries(2),
				kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			err = cl.ProduceSync(ctx, tc.r).FirstErr()
			if !errors.Is(err, tc.want) {
				t.Fatalf("produce: %v, want %v", err, tc.want)
			}
		})
	}
	if n := e.countLog(); n != 0 {
		t.Fatalf("the log holds %d events, want none", n)
	}
	// Raw: a partition the topic does not have, a topic not served, a
	// batch whose CRC does not match.
	rc := dialRaw(t, e.addr)
	batch := encodeBatch(t, -1, 0, nil, rec{key: []byte("k"), value: []byte(`{}`)})
	corrupt := slices.Clone(batch)
	corrupt[len(corrupt)-1] ^= 1
	for _, tc := range []struct {
		name  string
		req   *kmsg.ProduceRequest
		wantC int16
	}{
		{"partition out of range", produceRequest(9, "events", map[int32][]byte{2: batch}), kerr.UnknownTopicOrPartition.Code},
		{"negative partition", produceRequest(3, "events", map[int32][]byte{-1: batch}), kerr.UnknownTopicOrPartition.Code},
		{"unknown topic", produceRequest(9, "nope", map[int32][]byte{0: batch}), kerr.UnknownTopicOrPartition.Code},
		{"corrupt batch", produceRequest(9, "events", map[int32][]byte{0: corrupt}), kerr.CorruptMessage.Code},
	} {
		resp, err := rc.do(tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if code := resp.(*kmsg.ProduceResponse).Topics[0].Partitions[0].ErrorCode; code != tc.wantC {
			t.Errorf("%s: %v, want %v", tc.name, kerr.ErrorForCode(code), kerr.ErrorForCode(tc.wantC))
		}
	}
	if n := e.countLog(); n != 0 {
		t.Fatalf("the log holds %d events, want none", n)
	}
}

// TestProduceReadOnly: a read-only endpoint refuses an idempotent
// producer's id (CLUSTER_AUTHORIZATION_FAILED) and a plain producer's
// records (TOPIC_AUTHORIZATION_FAILED), and appends nothing.
func TestProduceReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, "", kafka.Options{ReadOnly: true})
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		opts []kgo.Opt
		want error
	}{
		{"idempotent", nil, kerr.ClusterAuthorizationFailed},
		{"plain", []kgo.Opt{kgo.DisableIdempotentWrite()}, kerr.TopicAuthorizationFailed},
	} {
		cl, err := kgo.NewClient(append(tc.opts, kgo.SeedBrokers(e.addr), kgo.RecordRetries(1))...)
		if err != nil {
			t.Fatal(err)
		}
		err = cl.ProduceSync(ctx, &kgo.Record{Topic: "events", Key: []byte("k"), Value: []byte(`{}`)}).FirstErr()
		cl.Close()
		if !errors.Is(err, tc.want) {
			t.Errorf("%s producer: %v, want %v", tc.name, err, tc.want)
		}
	}
	if n := e.countLog(); n != 0 {
		t.Fatalf("a read-only endpoint appended %d events", n)
	}
}

// TestProduceAcksZero: a producer that asks for no answer (acks 0) has
// its records appended all the same, and the connection goes on: the
// answer to the next request is that request's.
func TestProduceAcksZero(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	e := newEnv(t, 4, "", kafka.Options{})
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	want := randomRecords(seed, 200, 5)
	produceAll(ctx, t, cl, want, seed)
	waitFor(t, 30*time.Second, "the records produced with acks 0 appended", func() bool { return e.countLog() >= len(want) })
	e.checkLanded(want, 4, seed)

	rc := dialRaw(t, e.addr)
	req := produceRequest(9, "events", map[int32][]byte{0: encodeBatch(t, -1, 0, nil, rec{key: []byte("acks0"), value: []byte(`{}`)})})
	req.Acks = 0
	rc.corr++
	if err := rc.send(rc.f.AppendRequest(nil, req, rc.corr)); err != nil {
		t.Fatal(err)
	}
	av := kmsg.NewPtrApiVersionsRequest()
	av.SetVersion(3)
	if _, err := rc.do(av); err != nil {
		t.Fatalf("ApiVersions after a Produce with acks 0: %v", err)
	}
	waitFor(t, 30*time.Second, "the raw record produced with acks 0 appended", func() bool { return e.countLog() == len(want)+1 })
}

// sequence runs topic 1's sequencer until the test ends.
func (e *env) sequence(ctx context.Context) {
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	log := zerolog.Nop()
	go func() { done <- pgevents.Sequence(ctx, e.pool, 1, "kafka-test", &log) }()
	e.t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			e.t.Errorf("sequencer: %v", err)
		}
	})
}

// TestKgoProduceSequenced: to a sequenced topic, produced records are
// staged; once the topic's sequencer has moved them into the log, a kgo
// consumer reads every one of them exactly once, each key's in the order
// produced.
func TestKgoProduceSequenced(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	e := newEnv(t, 4, schema.ScopeSequenced, kafka.Options{})
	ctx, cancel := context.WithTimeout(e.ctx, 90*time.Second)
	defer cancel()
	e.sequence(ctx)
	prod, err := kgo.NewClient(kgo.SeedBrokers(e.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	want := randomRecords(seed, 300, 7)
	produceAll(ctx, t, prod, want, seed)
	waitFor(t, 30*time.Second, "the sequencer moved every record into the log", func() bool { return e.countLog() >= len(want) })
	e.checkLanded(want, 4, seed)

	cons, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.ConsumeTopics("events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	got := map[int]int{}
	byHost := map[string][]int{}
	for n := 0; n < len(want); {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records before the deadline (seed %d)", n, len(want), seed)
		}
		for _, fe := range fs.Errors() {
			t.Fatalf("fetch %s/%d: %v (seed %d)", fe.Topic, fe.Partition, fe.Err, seed)
		}
		for _, r := range fs.Records() {
			var v struct{ I int }
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Fatalf("record %s: %v", r.Value, err)
			}
			got[v.I]++
			byHost[string(r.Key)] = append(byHost[string(r.Key)], v.I)
			n++
		}
	}
	for i := range want {
		if got[i] != 1 {
			t.Errorf("record %d consumed %d times (seed %d)", i, got[i], seed)
		}
	}
	for h, is := range byHost {
		if !slices.IsSorted(is) {
			t.Errorf("host %s: consumed %v, not in the order produced (seed %d)", h, is, seed)
		}
	}
}
