// Package pgeventstype holds the types that pgevents' packages share with
// their users: an event as handlers receive it, a dead letter as operators
// list it, and what a pass of retention did. It imports nothing of
// pgevents, so every package may use it; the root package re-exports each
// type under the same name (pgevents.Event is pgeventstype.Event).
package pgeventstype

import (
	"encoding/json"
	"math"
	"time"
)

// Event is one event of the log, as a consumer reads it. Its JSON form uses
// the column names of outbox_message_t, as to_jsonb() writes a row.
type Event struct {
	// Offset is the event's c_offset: gapless and commit-ordered per topic,
	// or per partition under offset scope 'partition'.
	Offset int64 `json:"c_offset"`
	// TopicID is the topic the event was appended to.
	TopicID int `json:"topic_id"`
	// PartitionID is the partition computed from HostID at append.
	PartitionID int `json:"partition_id"`
	// EventID is a random UUID in text form, unique to the event: the
	// idempotency key for effects outside PostgreSQL.
	EventID string `json:"event_id"`
	// HostID is the partition key (the tenant).
	HostID string `json:"host_id"`
	// UserID is the grouping key within a host; empty when not given.
	UserID string `json:"user_id"`
	// TransactionID identifies the producer transaction; it is the same for
	// every event that transaction appended.
	TransactionID int64 `json:"transaction_id"`
	// EventType names the kind of event and selects its handler.
	EventType string `json:"event_type"`
	// Payload is the event's body, JSON; nil when the producer gave none.
	Payload json.RawMessage `json:"payload"`
	// Metadata is optional JSON beside the payload; nil when absent.
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// CreatedAt is the database clock at append (clock_timestamp()).
	CreatedAt time.Time `json:"created_at"`
	// IdempotencyKey, when set, makes an append idempotent: within the
	// topic's idempotency window, a second append of the key to the topic
	// appends nothing and returns the first one's offset. Append reads it;
	// it is not stored with the event (a handler sees it empty).
	IdempotencyKey string `json:"-"`
}

// DeadLetter is a unit (the partition-local slice of one producer
// transaction) that failed permanently, as recorded in dead_letter_queue.
type DeadLetter struct {
	// ID identifies the dead letter for replay and discard.
	ID int64 `json:"id"`
	// Group is the consumer group whose handlers failed.
	Group string `json:"group_id"`
	// Topic is the unit's topic.
	Topic int `json:"topic_id"`
	// Partition is the unit's partition.
	Partition int `json:"partition_id"`
	// FirstOffset is the unit's first offset.
	FirstOffset int64 `json:"first_offset"`
	// LastOffset is the unit's last offset.
	LastOffset int64 `json:"last_offset"`
	// TransactionID is the unit's producer transaction.
	TransactionID int64 `json:"transaction_id"`
	// EventIDs are the unit's event ids, in offset order.
	EventIDs []string `json:"event_ids"`
	// HostIDs are the unit's hosts.
	HostIDs []string `json:"host_ids"`
	// EventTypes are the event types of the unit's events, each once,
	// sorted.
	EventTypes []string `json:"event_types"`
	// Error is the failure's reason.
	Error string `json:"error"`
	// Attempts counts the unit's failures.
	Attempts int `json:"attempts"`
	// FirstFailedAt is when the unit first failed.
	FirstFailedAt time.Time `json:"first_failed_at"`
	// LastFailedAt is when the unit (or its last replay) last failed.
	LastFailedAt time.Time `json:"last_failed_at"`
	// ParkHosts says that the unit's hosts are parked behind it.
	ParkHosts bool `json:"parked_hosts"`
	// CreatedAt is when the dead letter was written.
	CreatedAt time.Time `json:"created_at"`
	// Parked is the number of events parked behind the dead letter.
	Parked int64 `json:"parked_events"`
	// Events are the unit's events, filled when one dead letter is read
	// whole.
	Events []Event `json:"events,omitempty"`
}

// NoLimit is the offset that bounds nothing: a watermark no group holds, a
// layout no other follows.
const NoLimit = int64(math.MaxInt64)

// RemovedSegment describes a segment of the log that retention removed.
type RemovedSegment struct {
	// Segment is the segment's table.
	Segment string
	// Partition is the segment's partition.
	Partition int
	// Lo and Hi bound the partition's offsets the segment held: [Lo, Hi).
	Lo, Hi int64
	// Reason is "retention" or "max_retention".
	Reason string
	// Skipped counts the events removed before a group handled them, by
	// group.
	Skipped map[string]int64
}

// Retention is what one pass of retention found and did.
type Retention struct {
	// Watermark is the lowest of the partitions' watermarks (the lowest
	// offset of the partition an ACTIVE or PAUSED group needs) that were
	// read; NoLimit when none holds any.
	Watermark int64
	// Removed lists the segments removed, oldest first per partition.
	Removed []RemovedSegment
	// Blocked says why a partition's oldest segment stayed, for the first
	// partition where one did.
	Blocked string
}
