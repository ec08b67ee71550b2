package kafka

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// event is one event as the endpoint serves it.
type event struct {
	offset    int64
	eventID   string
	host      string
	user      string
	txid      int64
	eventType string
	payload   []byte // nil: none
	metadata  []byte // nil: none
	createdAt time.Time
}

// Header keys of a record served from an event, beside the metadata's
// entries.
const (
	HeaderEventType     = "event_type"
	HeaderEventID       = "event_id"
	HeaderUserID        = "user_id"
	HeaderTransactionID = "transaction_id"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// batchHeaderSize is the size of a record batch's header (magic 2), from
// its base offset to its record count.
const batchHeaderSize = 61

// appendBatch appends to dst one record batch (magic 2, uncompressed)
// holding evs, which are in offset order: record i has offset delta
// evs[i].offset - evs[0].offset, so that a partition's offsets with gaps
// (scope topic) are served as a compacted topic's are. It writes the
// records in place, after the batch's header, and fills in the header's
// length, maximum timestamp and CRC-32C last: no record is copied twice.
func appendBatch(dst []byte, evs []event) []byte {
	first, last := evs[0], evs[len(evs)-1]
	firstTs := first.createdAt.UnixMilli()
	maxTs := firstTs
	start := len(dst)
	dst = kbin.AppendInt64(dst, first.offset)
	dst = kbin.AppendInt32(dst, 0) // length, below
	dst = kbin.AppendInt32(dst, 0) // partition leader epoch
	dst = kbin.AppendInt8(dst, 2)  // magic
	dst = kbin.AppendInt32(dst, 0) // CRC, below
	dst = kbin.AppendInt16(dst, 0) // attributes: no compression, create time
	dst = kbin.AppendInt32(dst, int32(last.offset-first.offset))
	dst = kbin.AppendInt64(dst, firstTs)
	dst = kbin.AppendInt64(dst, firstTs) // max timestamp, below
	dst = kbin.AppendInt64(dst, -1)      // producer id
	dst = kbin.AppendInt16(dst, -1)      // producer epoch
	dst = kbin.AppendInt32(dst, -1)      // first sequence
	dst = kbin.AppendInt32(dst, int32(len(evs)))
	for _, ev := range evs {
		ts := ev.createdAt.UnixMilli()
		maxTs = max(maxTs, ts)
		hs := headers(ev)
		var value []byte
		if ev.payload != nil {
			value = ev.payload
		}
		dst = appendRecord(dst, ts-firstTs, int32(ev.offset-first.offset), []byte(ev.host), value, hs)
	}
	binary.BigEndian.PutUint32(dst[start+8:], uint32(len(dst)-start-12))
	binary.BigEndian.PutUint64(dst[start+35:], uint64(maxTs))
	binary.BigEndian.PutUint32(dst[start+17:], crc32.Checksum(dst[start+21:], castagnoli))
	return dst
}

// appendRecord appends one record: its length (a varint of the bytes
// after it, computed first), attributes, timestamp and offset deltas, key,
// value (nil: null) and headers.
func appendRecord(dst []byte, tsDelta int64, offDelta int32, key, value []byte, hs []kmsg.Header) []byte {
	n := 1 + varlongSize(tsDelta) + varintSize(int64(offDelta)) + bytesSize(key) + bytesSize(value) + varintSize(int64(len(hs)))
	for _, h := range hs {
		n += varintSize(int64(len(h.Key))) + len(h.Key) + bytesSize(h.Value)
	}
	dst = kbin.AppendVarint(dst, int32(n))
	dst = append(dst, 0)
	dst = kbin.AppendVarlong(dst, tsDelta)
	dst = kbin.AppendVarint(dst, offDelta)
	dst = kbin.AppendVarintBytes(dst, key)
	dst = kbin.AppendVarintBytes(dst, value)
	dst = kbin.AppendVarint(dst, int32(len(hs)))
	for _, h := range hs {
		dst = kbin.AppendVarintString(dst, h.Key)
		dst = kbin.AppendVarintBytes(dst, h.Value)
	}
	return dst
}

// varintSize is the size of v as a zigzag varint.
func varintSize(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

func varlongSize(v int64) int { return varintSize(v) }

// bytesSize is the size of b as varint-prefixed bytes (nil: the length
// -1 alone).
func bytesSize(b []byte) int {
	if b == nil {
		return varintSize(-1)
	}
	return varintSize(int64(len(b))) + len(b)
}

// headers returns the record headers of ev: its event_type, event_id,
// user_id (when set), transaction_id, and the metadata's entries (a string
// entry as its text, another value as its JSON).
func headers(ev event) []kmsg.Header {
	hs := []kmsg.Header{
		{Key: HeaderEventType, Value: []byte(ev.eventType)},
		{Key: HeaderEventID, Value: []byte(ev.eventID)},
	}
	if ev.user != "" {
		hs = append(hs, kmsg.Header{Key: HeaderUserID, Value: []byte(ev.user)})
	}
	hs = append(hs, kmsg.Header{Key: HeaderTransactionID, Value: strconv.AppendInt(nil, ev.txid, 10)})
	if ev.metadata == nil {
		return hs
	}
	var md map[string]json.RawMessage
	if json.Unmarshal(ev.metadata, &md) != nil {
		return append(hs, kmsg.Header{Key: "metadata", Value: ev.metadata})
	}
	for k, v := range md {
		var s string
		if json.Unmarshal(v, &s) == nil {
			hs = append(hs, kmsg.Header{Key: k, Value: []byte(s)})
		} else {
			hs = append(hs, kmsg.Header{Key: k, Value: v})
		}
	}
	return hs
}

// produced is one record of a Produce request.
type produced struct {
	key, value []byte
	headers    []kmsg.Header
	producerID int64 // its batch's
	seq        int32 // the producer's sequence number; -1 when not idempotent
}

// producerBatch is what a Produce request's records of one partition carry.
type producerBatch struct {
	producerID int64
	epoch      int16
	records    []produced
}

var errCorrupt = errors.New("corrupt record batch")

// parseProduced decodes the record batches of one partition of a Produce
// request, checking each batch's CRC and decompressing it (the codecs
// franz-go supports). It never panics on bad input: kmsg's readers check
// each length, and a decompressed batch larger than limit is refused.
func parseProduced(raw []byte, limit int) (out producerBatch, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: decoding panicked: %v", errCorrupt, r)
		}
	}()
	out.producerID = -1
	for len(raw) > 0 {
		if len(raw) < batchHeaderSize {
			return out, fmt.Errorf("%w: %d bytes left, less than a batch header", errCorrupt, len(raw))
		}
		n := int(int32(binary.BigEndian.Uint32(raw[8:]))) + 12
		if n < batchHeaderSize || n > len(raw) {
			return out, fmt.Errorf("%w: batch length %d of %d bytes", errCorrupt, n, len(raw))
		}
		var b kmsg.RecordBatch
		if err := b.ReadFrom(raw[:n]); err != nil {
			return out, fmt.Errorf("%w: %w", errCorrupt, err)
		}
		if b.Magic != 2 {
			return out, fmt.Errorf("%w: magic %d (only record batches v2 are accepted)", errCorrupt, b.Magic)
		}
		if int32(crc32.Checksum(raw[21:n], castagnoli)) != b.CRC {
			return out, fmt.Errorf("%w: CRC mismatch", errCorrupt)
		}
		raw = raw[n:]
		if b.Attributes&0x20 != 0 {
			continue // a control batch (transaction marker)
		}
		recs := b.Records
		if codec := kgo.CompressionCodecType(b.Attributes & 0x7); codec != kgo.CodecNone {
			if recs, err = decompress(recs, codec, limit); err != nil {
				return out, err
			}
		}
		out.producerID, out.epoch = b.ProducerID, b.ProducerEpoch
		rd := kbin.Reader{Src: recs}
		for i := int32(0); i < b.NumRecords; i++ {
			l := rd.Varint()
			body := rd.Span(int(l))
			if !rd.Ok() || l < 0 {
				return out, fmt.Errorf("%w: record %d truncated", errCorrupt, i)
			}
			var r kmsg.Record
			// ReadFrom reads the length too: give it back its varint.
			if err := r.ReadFrom(append(kbin.AppendVarint(nil, l), body...)); err != nil {
				return out, fmt.Errorf("%w: record %d: %w", errCorrupt, i, err)
			}
			// A batch's records have the sequence numbers from its first
			// on, in order (whatever offset deltas the client wrote); they
			// wrap to 0 after MaxInt32, as Kafka's do.
			seq := int32(-1)
			if b.ProducerID >= 0 && b.FirstSequence >= 0 {
				seq = int32((int64(b.FirstSequence) + int64(i)) % (1 << 31))
			}
			out.records = append(out.records, produced{key: r.Key, value: r.Value, headers: r.Headers, producerID: b.ProducerID, seq: seq})
		}
		if len(rd.Src) != 0 {
			return out, fmt.Errorf("%w: %d bytes after the batch's records", errCorrupt, len(rd.Src))
		}
	}
	return out, nil
}

// decompress decompresses a batch's records, refusing more than limit
// bytes out before it has allocated much more than that: a batch of a few
// kilobytes may claim, or decompress to, gigabytes. (kgo's decompressor
// is bounded at 2 GiB only.)
func decompress(src []byte, codec kgo.CompressionCodecType, limit int) ([]byte, error) {
	var (
		out []byte
		err error
	)
	switch codec {
	case kgo.CodecGzip:
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(bytes.NewReader(src)); err == nil {
			out, err = readAtMost(zr, limit)
		}
	case kgo.CodecSnappy:
		out, err = unsnappy(src, limit)
	case kgo.CodecLz4:
		out, err = readAtMost(lz4.NewReader(bytes.NewReader(src)), limit)
	case kgo.CodecZstd:
		mem := max(limit, zstdWindow)
		dec := zstdDecoders.get(mem)
		if err = dec.Reset(bytes.NewReader(src)); err == nil {
			out, err = readAtMost(dec, limit)
		}
		_ = dec.Reset(nil)
		zstdDecoders.put(mem, dec)
	default:
		return nil, fmt.Errorf("%w: unknown compression codec %d", errCorrupt, codec)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: decompress: %w", errCorrupt, err)
	}
	return out, nil
}

var errTooLarge = errors.New("the batch decompresses to more than the request size limit")

// readAtMost reads r to its end, refusing more than limit bytes.
func readAtMost(r io.Reader, limit int) ([]byte, error) {
	out, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(out) > limit {
		return nil, errTooLarge
	}
	return out, nil
}

// xerialHeader starts snappy in the framing of the Java client (then
// version fields, then blocks of a big-endian length and a snappy block);
// without it, the batch is one snappy block.
var xerialHeader = []byte{130, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

// unsnappy decodes Kafka's snappy, checking the lengths its blocks claim
// against limit before it allocates.
func unsnappy(src []byte, limit int) ([]byte, error) {
	if len(src) < 16 || !bytes.HasPrefix(src, xerialHeader) {
		n, err := s2.DecodedLen(src)
		if err != nil {
			return nil, err
		}
		if n > limit {
			return nil, errTooLarge
		}
		return s2.Decode(nil, src)
	}
	var blocks [][]byte
	total := 0
	for rest := src[16:]; len(rest) > 0; {
		if len(rest) < 4 {
			return nil, errors.New("xerial framing: truncated block length")
		}
		size := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(size) > uint64(len(rest)) {
			return nil, errors.New("xerial framing: block beyond the data")
		}
		n, err := s2.DecodedLen(rest[:size])
		if err != nil {
			return nil, err
		}
		if total += n; total > limit {
			return nil, errTooLarge
		}
		blocks, rest = append(blocks, rest[:size]), rest[size:]
	}
	out := make([]byte, 0, total)
	for _, b := range blocks {
		d, err := s2.Decode(out[len(out):cap(out)], b) // in place: the room is there
		if err != nil {
			return nil, err
		}
		out = append(out, d...)
	}
	return out, nil
}

// zstdWindow is the least a zstd decoder accepts as a frame's window and
// decoded size: what streaming encoders declare at their usual levels (8
// MiB), so that a small MaxRequestBytes does not refuse their frames.
const zstdWindow = 8 << 20

// zstdDecoders keeps zstd decoders by the memory bound they were made
// with: a decoder refuses a frame whose window or decoded size is above
// it, before it allocates that much.
var zstdDecoders = decoderPools{pools: map[int]*sync.Pool{}}

type decoderPools struct {
	mu    sync.Mutex
	pools map[int]*sync.Pool
}

func (d *decoderPools) pool(mem int) *sync.Pool {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pools[mem]
	if p == nil {
		p = &sync.Pool{New: func() any {
			dec, _ := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
				zstd.WithDecoderMaxMemory(uint64(mem)))
			return dec
		}}
		d.pools[mem] = p
	}
	return p
}

func (d *decoderPools) get(mem int) *zstd.Decoder { return d.pool(mem).Get().(*zstd.Decoder) }

func (d *decoderPools) put(mem int, dec *zstd.Decoder) { d.pool(mem).Put(dec) }
