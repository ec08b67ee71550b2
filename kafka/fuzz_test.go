package kafka_test

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents/kafka"
)

// allocated is how many bytes f allocates on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// frame is req encoded as a request frame without its size, as the
// server's parser receives it.
func frame(req kmsg.Request, v int16) []byte {
	req.SetVersion(v)
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID("fuzz")).AppendRequest(nil, req, 42)[4:]
}

// rawBatch is a record batch with the given attributes (the codec in the
// low bits), record count claim and records, its length and CRC right.
func rawBatch(attrs int16, n int32, records []byte) []byte {
	b := kmsg.RecordBatch{Magic: 2, Attributes: attrs, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: n, LastOffsetDelta: max(n-1, 0), Records: records}
	return sealBatch(b.AppendTo(nil))
}

// requestSeeds are frames of several API keys, valid, truncated, and
// with counts that claim far more than the frame holds.
func requestSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	recs := []rec{{key: []byte("k"), value: []byte(`{"a": 1}`), headers: []kmsg.Header{{Key: "event_type", Value: []byte("t")}}}, {key: []byte("k2"), value: []byte(`[]`)}}
	gz, zs := kgo.GzipCompression(), kgo.ZstdCompression()
	batches := [][]byte{
		encodeBatch(t, -1, 0, nil, recs...),
		encodeBatch(t, 5, 0, &gz, recs...),
		encodeBatch(t, 5, 2, &zs, recs...),
		rawBatch(0, math.MaxInt32, encodeBatch(t, -1, 0, nil, recs...)[61:]),
	}
	for _, b := range batches {
		seeds = append(seeds, frame(produceRequest(9, "events", map[int32][]byte{0: b}), 9))
		seeds = append(seeds, frame(produceRequest(3, "events", map[int32][]byte{1: b}), 3))
	}
	fetch := kmsg.NewPtrFetchRequest()
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = "events"
	ft.Partitions = []kmsg.FetchRequestTopicPartition{{Partition: 0, FetchOffset: 1, PartitionMaxBytes: 1 << 20}}
	fetch.Topics = append(fetch.Topics, ft)
	md := kmsg.NewPtrMetadataRequest()
	md.Topics = []kmsg.MetadataRequestTopic{{Topic: kmsg.StringPtr("events")}}
	lo := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = "events"
	lt.Partitions = []kmsg.ListOffsetsRequestTopicPartition{{Partition: 0, Timestamp: -2}}
	lo.Topics = append(lo.Topics, lt)
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.ProtocolType = "g", "consumer"
	join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte{0, 1, 2}}}
	commit := kmsg.NewPtrOffsetCommitRequest()
	commit.Group = "g"
	commit.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: "events", Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: 3}}}}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.MemberID = "g", "m"
	sync.GroupAssignment = []kmsg.SyncGroupRequestGroupAssignment{{MemberID: "m", MemberAssignment: []byte{1}}}
	for _, r := range []struct {
		req kmsg.Request
		v   int16
	}{
		{kmsg.NewPtrApiVersionsRequest(), 3}, {kmsg.NewPtrApiVersionsRequest(), 0}, {kmsg.NewPtrApiVersionsRequest(), 99},
		{md, 12}, {md, 4}, {fetch, 12}, {fetch, 4}, {lo, 7}, {lo, 1},
		{join, 7}, {join, 0}, {commit, 8}, {commit, 2}, {sync, 5},
		{kmsg.NewPtrFindCoordinatorRequest(), 3}, {kmsg.NewPtrInitProducerIDRequest(), 4},
		{kmsg.NewPtrSASLHandshakeRequest(), 1}, {kmsg.NewPtrHeartbeatRequest(), 4},
	} {
		seeds = append(seeds, frame(r.req, r.v))
	}
	n := len(seeds)
	for _, s := range seeds[:n] {
		seeds = append(seeds, s[:len(s)/2], s[:min(len(s), 9)])
	}
	// Arrays claiming 2^31-1 elements: Metadata v4 topics, Fetch v12
	// topics, after the headers (10 bytes with client id "fuzz", 11 with
	// the flexible tags).
	big := binary.BigEndian.AppendUint32(nil, math.MaxInt32)
	seeds = append(seeds, append(frame(kmsg.NewPtrMetadataRequest(), 4)[:10], big...))
	f := frame(fetch, 12)
	seeds = append(seeds, append(f[:11+4+4+4+4+1+4+4], kbin.AppendUvarint(nil, math.MaxUint32)...))
	seeds = append(seeds, []byte{}, []byte{0, 0, 0}, bytes.Repeat([]byte{0xff}, 64))
	return append(seeds, tagClaims()...)
}

// tagClaims are flexible frames whose tagged-field sections claim 2^32-1
// tags in a few bytes: in the request header, and in an ApiVersions v3
// body (two empty compact strings, then the tags).
func tagClaims() [][]byte {
	huge := binary.AppendUvarint(nil, math.MaxUint32)
	header := []byte{0, 18, 0, 3, 0, 0, 0, 1, 0xff, 0xff}
	return [][]byte{
		append(bytes.Clone(header), huge...),
		append(append(bytes.Clone(header), 0, 1, 1), huge...),
		append([]byte{0, 0, 0, 9, 0, 0, 0, 1, 0xff, 0xff}, huge...), // Produce v9
	}
}

// TestRequestTagClaimsCostLittle: a frame of a few bytes claiming 2^32-1
// tagged fields is refused at once (kmsg before v1.15.1 looped over the
// claim, seconds of CPU per frame, before any authentication).
func TestRequestTagClaimsCostLittle(t *testing.T) {
	for _, f := range tagClaims() {
		start := time.Now()
		_, err := kafka.ParseRequest(f)
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("decoding %x took %s", f, d)
		}
		if err == nil {
			t.Errorf("decoding %x: no error", f)
		}
	}
}

// checkParse decodes frame as the server does, and a Produce request's
// records as produce does, and fails on a panic caught in the decoders or
// an allocation out of proportion with the frame: a decompressed batch
// may take limit bytes (and twice that while a buffer grows), a zstd
// stream its window (up to 8 MiB) and a decoder's buffers, the rest a
// small multiple of the frame.
func checkParse(t *testing.T, data []byte) {
	const limit = 1 << 20
	var err error
	n := allocated(func() {
		var req kmsg.Request
		if req, err = kafka.ParseRequest(data); err != nil {
			return
		}
		pr, ok := req.(*kmsg.ProduceRequest)
		if !ok {
			return
		}
		for _, rt := range pr.Topics {
			for _, rp := range rt.Partitions {
				if _, perr := kafka.ParseProduced(rp.Records, limit); perr != nil && strings.Contains(perr.Error(), "panicked") {
					err = perr
					return
				}
			}
		}
	})
	if err != nil && strings.Contains(err.Error(), "panicked") {
		t.Fatalf("decoding %x: %v", data, err)
	}
	if bound := uint64(3*limit + 256*len(data) + 16<<20); n > bound {
		t.Fatalf("decoding a frame of %d bytes allocated %d bytes, over %d", len(data), n, bound)
	}
}

// FuzzRequest feeds arbitrary frames to the request decoder, and a
// Produce request's records to the record batch decoder: neither panics,
// and what they allocate is bounded by the frame's size (and the
// decompression limit), whatever counts and lengths the frame claims.
func FuzzRequest(f *testing.F) {
	for _, s := range requestSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(checkParse)
}

// FuzzProduced feeds arbitrary record batches to the record batch
// decoder (fuzzing it past the request framing): no panic, allocation
// bounded by the data and the decompression limit. With reseal, the input
// is given a right length and CRC, as one batch, so that mutations reach
// the records.
func FuzzProduced(f *testing.F) {
	recs := []rec{{key: []byte("k"), value: []byte(`{"a": 1}`), headers: []kmsg.Header{{Key: "h", Value: []byte("v")}}}, {key: []byte("k2")}}
	for _, c := range []kgo.CompressionCodec{kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression()} {
		f.Add(encodeBatch(f, 3, 0, &c, recs...), true)
	}
	plain := encodeBatch(f, -1, 0, nil, recs...)
	f.Add(plain, true)
	f.Add(plain, false)
	f.Add(encodeBatch(f, 3, math.MaxInt32, nil, recs...), true)
	f.Add(append(bytes.Clone(plain), plain...), false)
	f.Add(rawBatch(0, math.MaxInt32, plain[61:]), true)
	f.Fuzz(func(t *testing.T, raw []byte, reseal bool) {
		const limit = 1 << 20
		if reseal && len(raw) >= 61 {
			raw = sealBatch(bytes.Clone(raw))
		}
		var err error
		n := allocated(func() { _, err = kafka.ParseProduced(raw, limit) })
		if err != nil && strings.Contains(err.Error(), "panicked") {
			t.Fatalf("decoding %x: %v", raw, err)
		}
		if bound := uint64(3*limit + 256*len(raw) + 16<<20); n > bound {
			t.Fatalf("decoding %d bytes allocated %d bytes, over %d", len(raw), n, bound)
		}
	})
}

// zeros writes n zero bytes to w, 1 MiB at a time.
func zeros(t *testing.T, w interface {
	Write([]byte) (int, error)
	Close() error
}, n int) {
	t.Helper()
	chunk := make([]byte, 1<<20)
	for ; n > 0; n -= len(chunk) {
		if _, err := w.Write(chunk[:min(n, len(chunk))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDecompressionBombsRefused: a batch of a few kilobytes that
// decompresses to 64 MiB, or claims to, is refused as corrupt once it
// passes the limit, having allocated little more than the limit (and a
// zstd stream's window, up to 8 MiB whatever the limit), under every
// codec.
func TestDecompressionBombsRefused(t *testing.T) {
	const (
		size  = 64 << 20
		limit = 1 << 20
	)
	var gz, zs, l4 bytes.Buffer
	zeros(t, gzip.NewWriter(&gz), size)
	zw, err := zstd.NewWriter(&zs)
	if err != nil {
		t.Fatal(err)
	}
	zeros(t, zw, size)
	zeros(t, lz4.NewWriter(&l4), size)
	// A snappy block is its decoded length, a varint, then its elements:
	// a literal, then copies of it.
	snappy := binary.AppendUvarint(nil, size)
	snappy = append(snappy, 0) // a literal of one byte
	snappy = append(snappy, 0)
	xerial := append([]byte{130, 'S', 'N', 'A', 'P', 'P', 'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1}, binary.BigEndian.AppendUint32(nil, uint32(len(snappy)))...)
	xerial = append(xerial, snappy...)
	for _, tc := range []struct {
		name  string
		codec kgo.CompressionCodecType
		data  []byte
	}{
		{"gzip", kgo.CodecGzip, gz.Bytes()},
		{"zstd", kgo.CodecZstd, zs.Bytes()},
		{"lz4", kgo.CodecLz4, l4.Bytes()},
		{"snappy", kgo.CodecSnappy, snappy},
		{"snappy xerial", kgo.CodecSnappy, xerial},
	} {
		batch := rawBatch(int16(tc.codec), 1, tc.data)
		var err error
		n := allocated(func() { _, err = kafka.ParseProduced(batch, limit) })
		if err == nil {
			t.Errorf("%s: a batch decompressing to %d bytes was accepted under a limit of %d", tc.name, size, limit)
		}
		if n > 8*limit+16<<20 {
			t.Errorf("%s: refusing a bomb of %d bytes allocated %d bytes (limit %d)", tc.name, len(batch), n, limit)
		}
		t.Logf("%s: %d bytes: %v; allocated %d", tc.name, len(batch), err, n)
	}
}

// TestDecompressionWithinLimit: what a streaming encoder writes at its
// defaults (zstd declares an 8 MiB window) decompresses when its content
// is within the limit, under a limit smaller than the window.
func TestDecompressionWithinLimit(t *testing.T) {
	const limit = 1 << 20
	var raw []byte
	for i := range 2000 {
		raw = kbin.AppendVarint(raw, 0) // the record's length, written below
		start := len(raw)
		raw = (&kmsg.Record{OffsetDelta: int32(i), Key: []byte("k"), Value: []byte(`{"pad": "` + strings.Repeat("x", 200) + `"}`)}).AppendTo(raw[:start-1])
		body := bytes.Clone(raw[start:])
		raw = append(kbin.AppendVarint(raw[:start-1], int32(len(body))), body...)
	}
	var zs, gz, l4 bytes.Buffer
	zw, err := zstd.NewWriter(&zs)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []interface {
		Write([]byte) (int, error)
		Close() error
	}{zw, gzip.NewWriter(&gz), lz4.NewWriter(&l4)} {
		if _, err := w.Write(raw); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		codec kgo.CompressionCodecType
		data  []byte
	}{{"zstd", kgo.CodecZstd, zs.Bytes()}, {"gzip", kgo.CodecGzip, gz.Bytes()}, {"lz4", kgo.CodecLz4, l4.Bytes()}} {
		n, err := kafka.ParseProduced(rawBatch(int16(tc.codec), 2000, tc.data), limit)
		if err != nil || n != 2000 {
			t.Errorf("%s: %d records of %d bytes under a limit of %d: %d records, %v", tc.name, 2000, len(raw), limit, n, err)
		}
	}
}

// TestGarbageDoesNotStopTheEndpoint: connections that send garbage (sizes
// out of bounds, 2 GiB claims, random bodies, truncated frames) are
// closed; the endpoint goes on answering on new connections.
func TestGarbageDoesNotStopTheEndpoint(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 3))
	e := newEnv(t, 2, "", kafka.Options{MaxRequestBytes: 1 << 20})
	apiVersions := func() {
		t.Helper()
		rc := dialRaw(t, e.addr)
		req := kmsg.NewPtrApiVersionsRequest()
		req.SetVersion(3)
		if _, err := rc.do(req); err != nil {
			t.Fatalf("ApiVersions on a new connection: %v (seed %d)", err, seed)
		}
	}
	size := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	seeds := requestSeeds(t)
	for i := range 200 {
		var msg []byte
		switch i % 6 {
		case 0: // claims of 2 GiB, 4 GiB - 1 (negative), just above the limit
			msg = size([]uint32{1 << 31, math.MaxUint32, 1<<20 + 1, math.MaxInt32}[r.IntN(4)])
		case 1: // too short for a header
			msg = size(uint32(r.IntN(8)))
		case 2: // random body
			body := make([]byte, 8+r.IntN(512))
			for j := range body {
				body[j] = byte(r.Uint32())
			}
			msg = append(size(uint32(len(body))), body...)
		case 3: // a valid frame, bytes flipped
			s := bytes.Clone(seeds[r.IntN(len(seeds))])
			for range 1 + r.IntN(4) {
				if len(s) > 0 {
					s[r.IntN(len(s))] ^= byte(1 + r.IntN(255))
				}
			}
			msg = append(size(uint32(len(s))), s...)
		case 4: // a frame that claims more than it sends
			s := seeds[r.IntN(len(seeds))]
			msg = append(size(uint32(len(s)+100)), s...)
		case 5: // random bytes
			msg = make([]byte, r.IntN(64))
			for j := range msg {
				msg[j] = byte(r.Uint32())
			}
		}
		c, err := net.DialTimeout("tcp", e.addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial after %d garbage connections: %v (seed %d)", i, err, seed)
		}
		_, _ = c.Write(msg)
		if i%6 == 0 {
			// Refused before the body: the server closes at once.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Errorf("a frame claiming %x bytes was answered (seed %d)", msg, seed)
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Errorf("a frame claiming %x bytes: the connection stays open (seed %d)", msg, seed)
			}
		}
		c.Close()
		if i%20 == 0 {
			apiVersions()
		}
	}
	apiVersions()
}
