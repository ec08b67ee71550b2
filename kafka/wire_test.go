package kafka_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// rawClient speaks the protocol over one connection without a client
// library: the tests send requests kgo would not send (a batch mixing
// valid and invalid records, garbage) and read the answers as they are.
type rawClient struct {
	t    testing.TB
	c    net.Conn
	corr int32
	f    *kmsg.RequestFormatter
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, c: c, f: kmsg.NewRequestFormatter(kmsg.FormatterClientID("raw"))}
}

// do sends req in the version set on it and reads its answer.
func (r *rawClient) do(req kmsg.Request) (kmsg.Response, error) {
	r.corr++
	if err := r.send(r.f.AppendRequest(nil, req, r.corr)); err != nil {
		return nil, err
	}
	return r.read(req)
}

func (r *rawClient) send(frame []byte) error {
	_ = r.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := r.c.Write(frame)
	return err
}

// read reads the answer to req: its frame, its correlation id (which must
// be the last one sent), the header's tags, the body.
func (r *rawClient) read(req kmsg.Request) (kmsg.Response, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var size [4]byte
	if _, err := io.ReadFull(r.c, size[:]); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(r.c, body); err != nil {
		return nil, err
	}
	rd := kbin.Reader{Src: body}
	if corr := rd.Int32(); corr != r.corr {
		return nil, fmt.Errorf("answer to correlation id %d, want %d", corr, r.corr)
	}
	resp := req.ResponseKind()
	if resp.IsFlexible() && req.Key() != 18 {
		kmsg.SkipTags(&rd)
	}
	if err := resp.ReadFrom(rd.Src); err != nil {
		return nil, fmt.Errorf("answer to api key %d: %w", req.Key(), err)
	}
	return resp, nil
}

// rec is a record to encode: nil key or value stay null.
type rec struct {
	key, value []byte
	headers    []kmsg.Header
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeBatch encodes recs as a record batch v2, compressed with codec
// (nil: none), from producer pid (-1: not idempotent) with first sequence
// seq.
func encodeBatch(t testing.TB, pid int64, seq int32, codec *kgo.CompressionCodec, recs ...rec) []byte {
	t.Helper()
	return encodeBatchDeltas(t, pid, seq, codec, nil, recs...)
}

// encodeBatchDeltas is encodeBatch with the records' offset deltas given
// (nil: 0, 1, 2...).
func encodeBatchDeltas(t testing.TB, pid int64, seq int32, codec *kgo.CompressionCodec, deltas []int32, recs ...rec) []byte {
	t.Helper()
	var raw, one []byte
	for i, r := range recs {
		kr := kmsg.Record{OffsetDelta: int32(i), Key: r.key, Value: r.value, Headers: r.headers}
		if deltas != nil {
			kr.OffsetDelta = deltas[i]
		}
		// The record's length is a varint of what follows it: encode with
		// a length of 0 (one byte), then write the real one.
		one = kr.AppendTo(one[:0])
		raw = kbin.AppendVarint(raw, int32(len(one)-1))
		raw = append(raw, one[1:]...)
	}
	var attrs int16
	if codec != nil {
		c, err := kgo.DefaultCompressor(*codec)
		if err != nil {
			t.Fatal(err)
		}
		out, typ := c.Compress(new(bytes.Buffer), raw)
		raw, attrs = bytes.Clone(out), int16(typ)
	}
	epoch := int16(-1)
	if pid >= 0 {
		epoch = 0
	} else {
		seq = -1
	}
	b := kmsg.RecordBatch{
		Magic:           2,
		Attributes:      attrs,
		LastOffsetDelta: int32(len(recs) - 1),
		FirstTimestamp:  time.Now().UnixMilli(),
		MaxTimestamp:    time.Now().UnixMilli(),
		ProducerID:      pid,
		ProducerEpoch:   epoch,
		FirstSequence:   seq,
		NumRecords:      int32(len(recs)),
		Records:         raw,
	}
	return sealBatch(b.AppendTo(nil))
}

// sealBatch writes the length and the CRC-32C of an encoded batch.
func sealBatch(b []byte) []byte {
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12))
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], castagnoli))
	return b
}

// produceRequest is a Produce request of version v (acks all) with one
// batch per partition of topic.
func produceRequest(v int16, topic string, batches map[int32][]byte) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(v)
	req.Acks = -1
	req.TimeoutMillis = 10000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	for p, b := range batches {
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Partition = p
		rp.Records = b
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	return req
}
