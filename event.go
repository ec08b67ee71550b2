package pgevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/pgevents/pgevents/offsets"
)

// Event is one event of the log. Append reads TopicID, HostID, UserID,
// EventType, Payload and Metadata; the database sets the other fields, and a
// handler receives them all.
type Event = offsets.Event

// DefaultTopic is the topic an event is appended to when its TopicID is 0.
const DefaultTopic = 1

// Querier runs statements; pgx.Tx, *pgx.Conn and *pgxpool.Pool satisfy it.
// Append's events belong to the transaction of the Querier it is given.
type Querier = offsets.Querier

// ErrInvalidEvent is wrapped by Append's error when an event lacks HostID or
// EventType, or carries a payload that is not JSON.
var ErrInvalidEvent = errors.New("invalid event")

type appendItem struct {
	HostID    string          `json:"host_id"`
	UserID    string          `json:"user_id,omitempty"`
	EventType string          `json:"event_type"`
	Payload   json.RawMessage `json:"payload,omitempty"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
}

// Append appends events in q's transaction and returns their offsets, in the
// order given. Events of one topic take one round trip and receive
// consecutive offsets; events of several topics are appended topic by topic
// in ascending topic order (a fixed order, so that producers cannot deadlock
// on the topics' counter rows), one round trip each.
//
// The topic's counter row stays locked until q's transaction ends: append as
// late in the transaction as possible. Append checks HostID, EventType and
// that Payload and Metadata are valid JSON before any round trip.
func Append(ctx context.Context, q Querier, events ...Event) ([]int64, error) {
	if len(events) == 0 {
		return nil, nil
	}
	byTopic := map[int][]int{}
	for i := range events {
		ev := &events[i]
		if ev.HostID == "" {
			return nil, fmt.Errorf("append: event %d: host_id is required: %w", i, ErrInvalidEvent)
		}
		if ev.EventType == "" {
			return nil, fmt.Errorf("append: event %d: event_type is required: %w", i, ErrInvalidEvent)
		}
		if len(ev.Payload) > 0 && !json.Valid(ev.Payload) {
			return nil, fmt.Errorf("append: event %d: payload is not JSON: %w", i, ErrInvalidEvent)
		}
		if len(ev.Metadata) > 0 && !json.Valid(ev.Metadata) {
			return nil, fmt.Errorf("append: event %d: metadata is not JSON: %w", i, ErrInvalidEvent)
		}
		t := ev.TopicID
		if t == 0 {
			t = DefaultTopic
		}
		byTopic[t] = append(byTopic[t], i)
	}
	topics := make([]int, 0, len(byTopic))
	for t := range byTopic {
		topics = append(topics, t)
	}
	sort.Ints(topics)

	out := make([]int64, len(events))
	items := make([]appendItem, 0, len(events))
	for _, t := range topics {
		idx := byTopic[t]
		if len(idx) == 1 {
			// One event: append_event, without a JSON array.
			ev := &events[idx[0]]
			off, err := offsets.AppendOne(ctx, q, t, ev.HostID, ev.UserID, ev.EventType, ev.Payload, ev.Metadata)
			if err != nil {
				return nil, err
			}
			out[idx[0]] = off
			continue
		}
		items = items[:0]
		for _, i := range idx {
			ev := &events[i]
			items = append(items, appendItem{HostID: ev.HostID, UserID: ev.UserID, EventType: ev.EventType, Payload: ev.Payload, Metadata: ev.Metadata})
		}
		body, err := json.Marshal(items)
		if err != nil {
			return nil, fmt.Errorf("append: encode: %w", err)
		}
		offs, err := offsets.Append(ctx, q, t, body)
		if err != nil {
			return nil, err
		}
		if len(offs) != len(idx) {
			return nil, fmt.Errorf("append: topic %d: appended %d events, expected %d", t, len(offs), len(idx))
		}
		for k, i := range idx {
			out[i] = offs[k]
		}
	}
	return out, nil
}
