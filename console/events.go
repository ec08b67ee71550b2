package console

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// eventRow is an event of the log.
type eventRow struct {
	Offset    int64
	Topic     int
	Partition int
	EventID   string
	Host      string
	User      string
	TxID      int64
	Type      string
	Payload   []byte
	Metadata  []byte
	Created   time.Time
}

func scanEvent(row pgx.CollectableRow) (eventRow, error) {
	var e eventRow
	err := row.Scan(&e.Offset, &e.Topic, &e.Partition, &e.EventID, &e.Host, &e.User, &e.TxID, &e.Type, &e.Payload, &e.Metadata, &e.Created)
	return e, err
}

// eventsFilter is the events page's query; every field reaches the
// database as a parameter.
type eventsFilter struct {
	Partition string // "" : every partition
	From      string // ascending from this offset
	Time      string // ascending from this time
	Host      string
	Type      string
	ID        string
}

// eventsData is the events page's.
type eventsData struct {
	Topic      int
	Partitions int
	Filter     eventsFilter
	Events     []eventRow
	Ascending  bool
	Next       string // the next page's query, "" when there is none
}

func (c *Console) eventsPage(r *http.Request) (string, string, any, error) {
	topic, err := pathInt(r, "topic")
	if err != nil {
		return "", "", nil, err
	}
	q := r.URL.Query()
	f := eventsFilter{Partition: q.Get("partition"), From: q.Get("from"), Time: q.Get("time"), Host: q.Get("host"),
		Type: q.Get("type"), ID: q.Get("id")}
	partition, err := optInt(q, "partition", -1)
	if err != nil {
		return "", "", nil, err
	}
	if partition < -1 || partition > math.MaxInt32 {
		return "", "", nil, badRequest("partition %d does not exist", partition)
	}
	at, err := parseTime("time", f.Time)
	if err != nil {
		return "", "", nil, err
	}
	ctx, cancel := c.queryContext(r)
	defer cancel()
	d := eventsData{Topic: topic, Filter: f, Ascending: f.From != "" || f.Time != ""}
	topics, err := c.topics(ctx)
	if err != nil {
		return "", "", nil, err
	}
	for _, t := range topics {
		if t.ID == topic {
			d.Partitions = t.Partitions
		}
	}
	if d.Partitions == 0 {
		return "", "", nil, notFound("topic %d does not exist", topic)
	}
	limit := c.opts.PageSize
	// Ascending from (from, fp), or newest first below (before, bp).
	stmt, key, keyPart, keyDef, partDef := browseSQL, "from", "fp", int64(0), int64(0)
	if !d.Ascending {
		stmt, key, keyPart, keyDef, partDef = browseBackSQL, "before", "bp", math.MaxInt64, math.MaxInt32
	}
	offset, err := optInt(q, key, keyDef)
	if err != nil {
		return "", "", nil, err
	}
	offsetPart, err := optInt(q, keyPart, partDef)
	if err != nil {
		return "", "", nil, err
	}
	if at != nil {
		// Start at the lowest of the partitions' first offsets at that time.
		start, err := c.timeStart(ctx, topic, partition, d.Partitions, *at)
		if err != nil {
			return "", "", nil, err
		}
		if start > offset {
			offset, offsetPart = start, 0
		}
	}
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, stmt), topic, partition, offset, at, f.Host, f.Type, f.ID, limit, offsetPart)
	if err != nil {
		return "", "", nil, fmt.Errorf("console: events: %w", err)
	}
	if d.Events, err = pgx.CollectRows(rows, scanEvent); err != nil {
		return "", "", nil, fmt.Errorf("console: events: %w", err)
	}
	if len(d.Events) == limit {
		last := d.Events[len(d.Events)-1]
		next := url.Values{}
		for k, v := range map[string]string{"partition": f.Partition, "time": f.Time, "host": f.Host, "type": f.Type, "id": f.ID} {
			if v != "" {
				next.Set(k, v)
			}
		}
		if d.Ascending {
			next.Set("from", strconv.FormatInt(last.Offset, 10))
			next.Set("fp", strconv.Itoa(last.Partition+1))
		} else {
			next.Set("before", strconv.FormatInt(last.Offset, 10))
			next.Set("bp", strconv.Itoa(last.Partition))
		}
		d.Next = next.Encode()
	}
	return "events", fmt.Sprintf("Events of topic %d", topic), d, nil
}

// timeStart returns the lowest offset, over partition (-1: the topic's
// partitions partitions), from which its events were created at or after
// at (timeStartSQL).
func (c *Console) timeStart(ctx context.Context, topic int, partition int64, partitions int, at time.Time) (int64, error) {
	first, last := int(partition), int(partition)
	if partition < 0 {
		first, last = 0, partitions-1
	}
	start := int64(math.MaxInt64)
	for p := first; p <= last; p++ {
		var o int64
		if err := c.pool.QueryRow(ctx, schema.SQL(ctx, timeStartSQL), topic, p, at).Scan(&o); err != nil {
			return 0, fmt.Errorf("console: events at %s: %w", at.Format(time.RFC3339), err)
		}
		if o > 0 { // 0: the partition holds no event
			start = min(start, o)
		}
	}
	return start, nil
}

// optInt reads query value name as an integer, def when absent.
func optInt(q url.Values, name string, def int64) (int64, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, badRequest("%s %q is not a number", name, v)
	}
	return n, nil
}

// eventInGroup is where one event stands in one group.
type eventInGroup struct {
	Group       string
	State       string
	GroupLayout int
	EventLayout int
	DeadLetter  *int64
	DLError     *string
	ParkedBy    *int64
	Position    *int64
	HandledBy   *time.Time
	Ahead       *int64 // events before it in the partition, when pending
	Status      string // handled, dead-lettered, parked, pending, no position
	blocks
}

// blocks is what may keep a group from reaching an event or host.
type blocks struct {
	HaltOffset  *int64
	HaltReason  *string
	HaltedAt    *time.Time
	HostParked  *int64 // the dead letter the host is parked behind
	Owner       *string
	Live        bool
	LeaseExpiry *time.Time
}

// Blockers lists, in words, what stops the group in this partition now.
func (b blocks) Blockers(state string) []string {
	var out []string
	if state != "ACTIVE" {
		out = append(out, "the group is "+state)
	}
	if b.HaltOffset != nil {
		out = append(out, fmt.Sprintf("the partition is halted at offset %d", *b.HaltOffset))
	}
	if b.HostParked != nil {
		out = append(out, fmt.Sprintf("the host is parked behind dead letter %d", *b.HostParked))
	}
	switch {
	case b.Live:
	case b.Owner != nil && b.LeaseExpiry != nil:
		out = append(out, "no live owner: the lease of "+*b.Owner+" expired at "+formatTime(*b.LeaseExpiry))
	default:
		out = append(out, "no replica owns the partition")
	}
	return out
}

// eventData is an event's page.
type eventData struct {
	Event  eventRow
	Groups []eventInGroup
	Cap    int64
}

func (c *Console) eventPage(r *http.Request) (string, string, any, error) {
	topic, err := pathInt(r, "topic")
	if err != nil {
		return "", "", nil, err
	}
	partition, err := pathInt(r, "partition")
	if err != nil {
		return "", "", nil, err
	}
	offset, err := strconv.ParseInt(r.PathValue("offset"), 10, 64)
	if err != nil {
		return "", "", nil, badRequest("offset %q is not a number", r.PathValue("offset"))
	}
	ctx, cancel := c.queryContext(r)
	defer cancel()
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, eventSQL), topic, partition, offset)
	if err != nil {
		return "", "", nil, fmt.Errorf("console: event: %w", err)
	}
	d := eventData{Cap: countCap}
	d.Event, err = pgx.CollectExactlyOneRow(rows, scanEvent)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", nil, notFound("topic %d has no event at offset %d of partition %d (retention may have removed it)", topic, offset, partition)
	} else if err != nil {
		return "", "", nil, fmt.Errorf("console: event: %w", err)
	}
	rows, err = c.pool.Query(ctx, schema.SQL(ctx, eventPathSQL), topic, partition, offset, d.Event.EventID, d.Event.Host, countCap)
	if err != nil {
		return "", "", nil, fmt.Errorf("console: event path: %w", err)
	}
	d.Groups, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (eventInGroup, error) {
		var g eventInGroup
		err := row.Scan(&g.Group, &g.State, &g.GroupLayout, &g.EventLayout, &g.DeadLetter, &g.DLError, &g.ParkedBy,
			&g.Position, &g.HandledBy, &g.Ahead, &g.HaltOffset, &g.HaltReason, &g.HaltedAt, &g.HostParked,
			&g.Owner, &g.Live, &g.LeaseExpiry)
		g.Status = eventStatus(&g, offset)
		return g, err
	})
	if err != nil {
		return "", "", nil, fmt.Errorf("console: event path: %w", err)
	}
	return "event", fmt.Sprintf("Event %d/%d/%d", topic, partition, offset), d, nil
}

// eventStatus says where the event stands in the group.
func eventStatus(g *eventInGroup, offset int64) string {
	switch {
	case g.DeadLetter != nil:
		return "dead-lettered"
	case g.ParkedBy != nil:
		return "parked"
	case g.GroupLayout == 0:
		return "no position"
	case g.EventLayout < g.GroupLayout:
		g.Ahead = nil
		return "handled"
	case g.EventLayout > g.GroupLayout:
		g.Ahead = nil
		return "pending"
	case g.Position == nil:
		return "no position"
	case *g.Position > offset:
		return "handled"
	}
	return "pending"
}
