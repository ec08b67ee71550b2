package store

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Reading events.
//
// A consumer reads every field of every event (the handlers get them all),
// and at a drain's rate the generic row scanning of pgx (a scan plan per
// column, an allocation per string, a copy of each payload) is most of the
// consumer's CPU. scanEvents decodes the columns of eventColumns from the
// server's formats directly, and carves the strings and JSON of a
// batch out of a few large chunks instead of allocating each: a chunk is
// written once and never again, so the strings made over it with
// unsafe.String stay immutable, and it is freed by the garbage collector
// with the last event that refers to it. When the server sends a column in
// another format or type than expected, the rows are scanned by pgx.

// eventColumnTypes are the types of eventColumns, in order.
var eventColumnTypes = [...]uint32{
	pgtype.Int8OID, pgtype.Int4OID, pgtype.Int4OID, pgtype.UUIDOID, pgtype.TextOID, pgtype.TextOID,
	pgtype.Int8OID, pgtype.TextOID, pgtype.JSONBOID, pgtype.JSONBOID, pgtype.TimestamptzOID,
}

// chunkSize is the size of the chunks the strings and JSON of events are
// carved from; larger values get a chunk of their own.
const chunkSize = 32 << 10

// arena hands out write-once bytes from chunks.
type arena struct {
	chunk []byte // free space of the current chunk
}

// bytes returns a copy of b, carved from the current chunk.
func (a *arena) bytes(b []byte) []byte {
	n := len(b)
	if n > chunkSize/4 {
		return append([]byte(nil), b...)
	}
	if len(a.chunk) < n {
		a.chunk = make([]byte, chunkSize)
	}
	out := a.chunk[:n:n]
	copy(out, b)
	a.chunk = a.chunk[n:]
	return out
}

// string returns b as a string over a write-once copy.
func (a *arena) string(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	c := a.bytes(b)
	return unsafe.String(&c[0], len(c))
}

// uuid returns the text form of a binary UUID.
func (a *arena) uuid(b []byte) string {
	var t [36]byte
	hex.Encode(t[0:8], b[0:4])
	t[8] = '-'
	hex.Encode(t[9:13], b[4:6])
	t[13] = '-'
	hex.Encode(t[14:18], b[6:8])
	t[18] = '-'
	hex.Encode(t[19:23], b[8:10])
	t[23] = '-'
	hex.Encode(t[24:36], b[10:16])
	return a.string(t[:])
}

// jsonb returns the JSON of a jsonb value in format (text: the JSON;
// binary: a version byte, 1, then the JSON), or nil for NULL.
func (a *arena) jsonb(b []byte, format int16) ([]byte, bool) {
	if b == nil {
		return nil, true
	}
	if format == pgx.TextFormatCode {
		return a.bytes(b), true
	}
	if len(b) == 0 || b[0] != 1 {
		return nil, false
	}
	return a.bytes(b[1:]), true
}

// microsecFromUnixEpochToY2K is PostgreSQL's epoch, 2000-01-01, in Unix
// microseconds.
const microsecFromUnixEpochToY2K = 946684800 * 1000000

// timestamptz decodes a binary timestamptz as pgx does (local time).
func timestamptz(b []byte) time.Time {
	us := int64(binary.BigEndian.Uint64(b)) + microsecFromUnixEpochToY2K
	return time.Unix(us/1000000, (us%1000000)*1000)
}

// eventFormats are the formats of the jsonb columns of a result of
// eventColumns (text and binary are the same for text columns).
type eventFormats struct {
	payload, metadata int16
}

// fastEvents reports whether rows carry eventColumns with the expected
// types, fixed-size ones in the binary format, and returns the formats of
// the others.
func fastEvents(rows pgx.Rows) (eventFormats, bool) {
	return eventFormatsOf(rows.FieldDescriptions())
}

// eventFormatsOf is fastEvents on the columns fds.
func eventFormatsOf(fds []pgconn.FieldDescription) (eventFormats, bool) {
	if len(fds) != len(eventColumnTypes) {
		return eventFormats{}, false
	}
	for i, fd := range fds {
		if fd.DataTypeOID != eventColumnTypes[i] {
			return eventFormats{}, false
		}
		switch fd.DataTypeOID {
		case pgtype.TextOID, pgtype.JSONBOID:
		default:
			if fd.Format != pgx.BinaryFormatCode {
				return eventFormats{}, false
			}
		}
	}
	return eventFormats{payload: fds[8].Format, metadata: fds[9].Format}, true
}

// decodeEvent fills ev from the values of one row.
func (a *arena) decodeEvent(vals [][]byte, f eventFormats, ev *Event) error {
	for i, v := range vals {
		if v == nil && i != 8 && i != 9 {
			return fmt.Errorf("column %d is NULL", i)
		}
	}
	if len(vals[0]) != 8 || len(vals[1]) != 4 || len(vals[2]) != 4 || len(vals[3]) != 16 || len(vals[6]) != 8 || len(vals[10]) != 8 {
		return fmt.Errorf("unexpected binary lengths")
	}
	ev.Offset = int64(binary.BigEndian.Uint64(vals[0]))
	ev.TopicID = int(int32(binary.BigEndian.Uint32(vals[1])))
	ev.PartitionID = int(int32(binary.BigEndian.Uint32(vals[2])))
	ev.EventID = a.uuid(vals[3])
	ev.HostID = a.string(vals[4])
	ev.UserID = a.string(vals[5])
	ev.TransactionID = int64(binary.BigEndian.Uint64(vals[6]))
	ev.EventType = a.string(vals[7])
	var ok bool
	if ev.Payload, ok = a.jsonb(vals[8], f.payload); !ok {
		return fmt.Errorf("payload is not binary jsonb")
	}
	if ev.Metadata, ok = a.jsonb(vals[9], f.metadata); !ok {
		return fmt.Errorf("metadata is not binary jsonb")
	}
	ev.CreatedAt = timestamptz(vals[10])
	return nil
}

// scanEvents appends the events of rows, which select eventColumns, to buf.
func scanEvents(rows pgx.Rows, buf []Event, op string) ([]Event, error) {
	defer rows.Close()
	f, ok := fastEvents(rows)
	if !ok {
		return scanEventsGeneric(rows, buf, op)
	}
	var a arena
	for rows.Next() {
		buf = append(buf, Event{})
		if err := a.decodeEvent(rows.RawValues(), f, &buf[len(buf)-1]); err != nil {
			return buf[:len(buf)-1], fmt.Errorf("%s: %w", op, err)
		}
	}
	if err := rows.Err(); err != nil {
		return buf, fmt.Errorf("%s: %w", op, err)
	}
	return buf, nil
}

// scanEventsGeneric is scanEvents through pgx's scanning, for rows in
// another format than expected.
func scanEventsGeneric(rows pgx.Rows, buf []Event, op string) ([]Event, error) {
	for rows.Next() {
		buf = append(buf, Event{})
		ev := &buf[len(buf)-1]
		// Payload and metadata are scanned as bytes: into a
		// json.RawMessage pgx would run json.Unmarshal on them.
		if err := rows.Scan(&ev.Offset, &ev.TopicID, &ev.PartitionID, &ev.EventID, &ev.HostID, &ev.UserID,
			&ev.TransactionID, &ev.EventType, (*[]byte)(&ev.Payload), (*[]byte)(&ev.Metadata), &ev.CreatedAt); err != nil {
			return buf[:len(buf)-1], fmt.Errorf("%s: %w", op, err)
		}
	}
	if err := rows.Err(); err != nil {
		return buf, fmt.Errorf("%s: %w", op, err)
	}
	return buf, nil
}

// claimState is the state a claim statement's rows carry (claimSQL): the
// lease held, the group paused, the position (nil: none).
type claimState struct {
	held, paused bool
	next         *int64
}

// scanClaim reads the rows of a claim statement: each carries the claim's
// state, then an event's columns (NULL when the claim found none); the
// events are appended to buf.
func scanClaim(rows pgx.Rows, buf []Event) (claimState, []Event, error) {
	defer rows.Close()
	var st claimState
	fds := rows.FieldDescriptions()
	fast := len(fds) == 3+len(eventColumnTypes) && fds[0].DataTypeOID == pgtype.BoolOID && fds[1].DataTypeOID == pgtype.BoolOID &&
		fds[2].DataTypeOID == pgtype.Int8OID && fds[0].Format == pgx.BinaryFormatCode && fds[1].Format == pgx.BinaryFormatCode &&
		fds[2].Format == pgx.BinaryFormatCode
	var f eventFormats
	if fast {
		f, fast = eventFormatsOf(fds[3:])
	}
	if !fast {
		return scanClaimGeneric(rows, buf)
	}
	var a arena
	first := true
	for rows.Next() {
		vals := rows.RawValues()
		if first {
			first = false
			if len(vals[0]) != 1 || len(vals[1]) != 1 || vals[2] != nil && len(vals[2]) != 8 {
				return st, buf, fmt.Errorf("claim: unexpected binary lengths")
			}
			st.held, st.paused = vals[0][0] != 0, vals[1][0] != 0
			if vals[2] != nil {
				n := int64(binary.BigEndian.Uint64(vals[2]))
				st.next = &n
			}
		}
		if vals[3] == nil {
			continue // no event
		}
		buf = append(buf, Event{})
		if err := a.decodeEvent(vals[3:], f, &buf[len(buf)-1]); err != nil {
			return st, buf[:len(buf)-1], fmt.Errorf("claim: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return st, buf, fmt.Errorf("claim: %w", err)
	}
	return st, buf, nil
}

// scanClaimGeneric is scanClaim through pgx's scanning, for rows in other
// formats than expected.
func scanClaimGeneric(rows pgx.Rows, buf []Event) (claimState, []Event, error) {
	var st claimState
	first := true
	for rows.Next() {
		var (
			held, paused bool
			next, offset *int64
			topic, part  *int32
			txid         *int64
			eventID      *string
			host, user   *string
			typ          *string
			payload, md  []byte
			created      *time.Time
		)
		if err := rows.Scan(&held, &paused, &next, &offset, &topic, &part, &eventID, &host, &user, &txid, &typ, &payload, &md, &created); err != nil {
			return st, buf, fmt.Errorf("claim: %w", err)
		}
		if first {
			first = false
			st.held, st.paused, st.next = held, paused, next
		}
		if offset == nil {
			continue
		}
		if topic == nil || part == nil || eventID == nil || host == nil || user == nil || txid == nil || typ == nil || created == nil {
			return st, buf, fmt.Errorf("claim: an event column is NULL")
		}
		buf = append(buf, Event{Offset: *offset, TopicID: int(*topic), PartitionID: int(*part), EventID: *eventID, HostID: *host,
			UserID: *user, TransactionID: *txid, EventType: *typ, Payload: payload, Metadata: md, CreatedAt: *created})
	}
	if err := rows.Err(); err != nil {
		return st, buf, fmt.Errorf("claim: %w", err)
	}
	return st, buf, nil
}
