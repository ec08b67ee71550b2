package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/pgeventstype"
	"github.com/pgevents/pgevents/schema"
)

// Dead letters, parked hosts and halts. Every statement that changes them
// for a partition runs in a transaction holding that partition's position
// lock (a worker's batch, or the dead-letter admin after LockPosition), so
// the worker and the admin never race.
const (
	// writeDeadLetterSQL records a unit that failed permanently, copying its
	// events from the log, in the transaction that moves the group's
	// position past it: the unit is either still ahead or dead-lettered,
	// never dropped.
	writeDeadLetterSQL = `INSERT INTO {schema}dead_letter_queue
    (group_id, topic_id, partition_id, first_offset, last_offset, transaction_id,
     event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at, parked_hosts)
SELECT $1, $2, $3, $4, $5, $6,
       array_agg(m.event_id ORDER BY m.c_offset), array_agg(DISTINCT m.host_id),
       jsonb_agg(to_jsonb(m) ORDER BY m.c_offset), $7, $8, $9, $10, $11
FROM {schema}%[1]s m
WHERE m.topic_id = $2 AND m.partition_id = $3 AND m.c_offset BETWEEN $4 AND $5
RETURNING id, host_ids`

	// parkHostsSQL parks hosts behind dead letter $5. A host already parked
	// stays behind its first dead letter.
	parkHostsSQL = `INSERT INTO {schema}parked_hosts (group_id, topic_id, partition_id, host_id, dead_letter_id)
SELECT $1, $2, $3, h, $5 FROM unnest($4::text[]) AS h
ON CONFLICT (group_id, topic_id, partition_id, host_id) DO NOTHING`

	// parkEventsSQL holds back the events of a unit behind dead letter $6,
	// with a copy of each, and parks every host of the unit (a unit is
	// handled whole, so all its hosts now wait behind the same dead letter).
	parkEventsSQL = `WITH ev AS (
    INSERT INTO {schema}parked_events (group_id, topic_id, partition_id, c_offset, dead_letter_id, event)
    SELECT $1, $2, $3, m.c_offset, $6, to_jsonb(m)
    FROM {schema}%[1]s m
    WHERE m.topic_id = $2 AND m.partition_id = $3 AND m.c_offset BETWEEN $4 AND $5
    RETURNING (event->>'host_id') AS host_id
)
INSERT INTO {schema}parked_hosts (group_id, topic_id, partition_id, host_id, dead_letter_id)
SELECT DISTINCT $1, $2, $3, host_id, $6::bigint FROM ev
ON CONFLICT (group_id, topic_id, partition_id, host_id) DO NOTHING`

	// parkedSQL lists the partition's parked hosts. Queued right after the
	// claim, it reads them under the partition's lock.
	parkedSQL = `SELECT host_id, dead_letter_id FROM {schema}parked_hosts
WHERE group_id = $1 AND topic_id = $2 AND partition_id = $3`

	// deadLetterColumns are a dead letter's fields (DeadLetter), its parked
	// events counted and its event types read from its events, each once.
	deadLetterColumns = `id, group_id, topic_id, partition_id, first_offset, last_offset, transaction_id,
       event_ids::text[], host_ids, error, attempts, first_failed_at, last_failed_at, parked_hosts, created_at,
       (SELECT count(*) FROM {schema}parked_events p WHERE p.dead_letter_id = d.id),
       ARRAY(SELECT DISTINCT e->>'event_type' FROM jsonb_array_elements(d.events) e ORDER BY 1)`

	listDeadLettersSQL = `SELECT ` + deadLetterColumns + `
FROM {schema}dead_letter_queue d
WHERE ($1 = '' OR group_id = $1)
ORDER BY id`

	getDeadLetterSQL = `SELECT ` + deadLetterColumns + `, events
FROM {schema}dead_letter_queue d WHERE id = $1`

	parkedEventsSQL = `SELECT event FROM {schema}parked_events WHERE dead_letter_id = $1 ORDER BY id`

	// groupLayoutSharedSQL keeps the group's layout from changing
	// (SwitchLayout and Place lock the row FOR UPDATE) until the
	// transaction ends, and reads it. It is a statement of its own: locked
	// in a join, a row updated meanwhile by a switch would be re-checked
	// against the old layout's row, and nothing returned.
	groupLayoutSharedSQL = `SELECT version FROM {schema}group_layouts WHERE group_id = $1 AND topic_id = $2 FOR SHARE`

	layoutPartitionsSQL = `SELECT total_partitions FROM {schema}topic_layouts WHERE topic_id = $1 AND version = $2`

	// lockGroupPositionsSQL takes every partition's position lock of the
	// group, in ascending order (a worker holds one at a time, so no
	// deadlock).
	lockGroupPositionsSQL = `SELECT count(*) FROM {schema}lock_group_positions($1, $2)`

	// groupParkedSQL lists the group's parked events in the order they were
	// parked, which is each host's order.
	groupParkedSQL = `SELECT id, dead_letter_id, event FROM {schema}parked_events
WHERE group_id = $1 AND topic_id = $2 ORDER BY id`

	// parkingDeadLettersSQL lists the group's dead letters whose hosts
	// are parked behind them, oldest first.
	parkingDeadLettersSQL = `SELECT id, host_ids FROM {schema}dead_letter_queue
WHERE group_id = $1 AND topic_id = $2 AND parked_hosts ORDER BY id`

	// clearParkedHostsSQL and parkHostsAtSQL rewrite the group's parked
	// hosts, each in its partition of the group's layout ($5 partitions).
	clearParkedHostsSQL = `DELETE FROM {schema}parked_hosts WHERE group_id = $1 AND topic_id = $2`

	parkHostsAtSQL = `INSERT INTO {schema}parked_hosts (group_id, topic_id, partition_id, host_id, dead_letter_id)
SELECT $1, $2, {schema}event_partition(u.h, $5), u.h, u.dl FROM unnest($3::text[], $4::bigint[]) AS u(h, dl)`

	// reparkEventsSQL points parked events at the dead letter they now wait
	// behind.
	reparkEventsSQL = `UPDATE {schema}parked_events p SET dead_letter_id = u.dl
FROM unnest($3::bigint[], $4::bigint[]) AS u(id, dl)
WHERE p.group_id = $1 AND p.topic_id = $2 AND p.id = u.id AND p.dead_letter_id <> u.dl`

	// releaseParkedSQL removes the parked events that were handled.
	releaseParkedSQL = `DELETE FROM {schema}parked_events WHERE group_id = $1 AND topic_id = $2 AND id = ANY($3::bigint[])`

	deleteDeadLetterSQL = `DELETE FROM {schema}dead_letter_queue WHERE id = $1`

	failedReplaySQL = `UPDATE {schema}dead_letter_queue
SET attempts = attempts + 1, last_failed_at = now(), error = $2 WHERE id = $1`
)

// DeadLetter is a dead-lettered unit (pgeventstype.DeadLetter).
type DeadLetter = pgeventstype.DeadLetter

// WriteDeadLetter records d's unit, offsets FirstOffset to LastOffset of its
// partition, in tx, with a copy of its events; when d.ParkHosts is set it
// also parks the unit's hosts behind it. It returns the row's id and the
// unit's hosts.
func WriteDeadLetter(ctx context.Context, tx pgx.Tx, ps *PartitionSQL, d DeadLetter) (int64, []string, error) {
	var (
		id    int64
		hosts []string
	)
	err := tx.QueryRow(ctx, schema.SQL(ctx, ps.deadLetter), d.Group, d.Topic, d.Partition, d.FirstOffset, d.LastOffset,
		d.TransactionID, d.Error, d.Attempts, d.FirstFailedAt, d.LastFailedAt, d.ParkHosts).Scan(&id, &hosts)
	if err != nil {
		return 0, nil, fmt.Errorf("dead-letter offsets %d-%d: %w", d.FirstOffset, d.LastOffset, err)
	}
	if d.ParkHosts {
		if _, err := tx.Exec(ctx, schema.SQL(ctx, parkHostsSQL), d.Group, d.Topic, d.Partition, hosts, id); err != nil {
			return 0, nil, fmt.Errorf("park hosts: %w", err)
		}
	}
	return id, hosts, nil
}

// ParkEvents holds back the events first..last of a partition behind dead
// letter deadLetterID, and parks their hosts, in tx.
func ParkEvents(ctx context.Context, tx pgx.Tx, ps *PartitionSQL, group string, topic, partition int, first, last, deadLetterID int64) error {
	if _, err := tx.Exec(ctx, schema.SQL(ctx, ps.park), group, topic, partition, first, last, deadLetterID); err != nil {
		return fmt.Errorf("park offsets %d-%d: %w", first, last, err)
	}
	return nil
}

func scanDeadLetter(row pgx.Row, withEvents bool) (DeadLetter, error) {
	var d DeadLetter
	dest := []any{&d.ID, &d.Group, &d.Topic, &d.Partition, &d.FirstOffset, &d.LastOffset, &d.TransactionID,
		&d.EventIDs, &d.HostIDs, &d.Error, &d.Attempts, &d.FirstFailedAt, &d.LastFailedAt, &d.ParkHosts, &d.CreatedAt, &d.Parked, &d.EventTypes}
	var events []byte
	if withEvents {
		dest = append(dest, &events)
	}
	if err := row.Scan(dest...); err != nil {
		return d, err
	}
	if withEvents {
		var err error
		if d.Events, err = decodeEvents(events); err != nil {
			return d, err
		}
	}
	return d, nil
}

// ListDeadLetters returns the dead letters of group (every group when
// group is empty), oldest first.
func ListDeadLetters(ctx context.Context, q schema.DB, group string) ([]DeadLetter, error) {
	rows, err := q.Query(ctx, schema.SQL(ctx, listDeadLettersSQL), group)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		d, err := scanDeadLetter(rows, false)
		if err != nil {
			return nil, fmt.Errorf("list dead letters: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// ErrNoDeadLetter is returned when a dead letter id does not exist.
var ErrNoDeadLetter = errors.New("no such dead letter")

// GetDeadLetter returns dead letter id with its events.
func GetDeadLetter(ctx context.Context, q schema.DB, id int64) (DeadLetter, error) {
	d, err := scanDeadLetter(q.QueryRow(ctx, schema.SQL(ctx, getDeadLetterSQL), id), true)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("dead letter %d: %w", id, ErrNoDeadLetter)
	}
	if err != nil {
		return d, fmt.Errorf("dead letter %d: %w", id, err)
	}
	return d, nil
}

// ParkedEvents returns the events parked behind dead letter id, in offset
// order.
func ParkedEvents(ctx context.Context, q schema.DB, id int64) ([]Event, error) {
	rows, err := q.Query(ctx, schema.SQL(ctx, parkedEventsSQL), id)
	if err != nil {
		return nil, fmt.Errorf("parked events: %w", err)
	}
	raw, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, fmt.Errorf("parked events: %w", err)
	}
	out := make([]Event, 0, len(raw))
	for _, r := range raw {
		ev, err := decodeEvent(r)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

// LockGroup takes, in tx, what resolving a dead letter of the group needs:
// the group's layout (shared: it cannot switch until tx ends) and every
// partition's position lock, in ascending order, as each partition's
// worker would take it. It returns the layout's partition count.
func LockGroup(ctx context.Context, tx pgx.Tx, group string, topic int) (int, error) {
	var version, partitions int
	err := tx.QueryRow(ctx, schema.SQL(ctx, groupLayoutSharedSQL), group, topic).Scan(&version)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNoPosition
	}
	if err == nil {
		err = tx.QueryRow(ctx, schema.SQL(ctx, layoutPartitionsSQL), topic, version).Scan(&partitions)
	}
	if err != nil {
		return 0, fmt.Errorf("lock the group's layout: %w", err)
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, lockGroupPositionsSQL), group, topic); err != nil {
		return 0, fmt.Errorf("lock the group's positions: %w", err)
	}
	return partitions, nil
}

// Parked is an event held back behind a dead letter.
type Parked struct {
	// ID numbers parked events in the order they were parked.
	ID int64
	// DeadLetterID is the dead letter the event waits behind.
	DeadLetterID int64
	// Event is the event.
	Event Event
}

// GroupParked returns the group's parked events in offset order.
func GroupParked(ctx context.Context, q schema.DB, group string, topic int) ([]Parked, error) {
	rows, err := q.Query(ctx, schema.SQL(ctx, groupParkedSQL), group, topic)
	if err != nil {
		return nil, fmt.Errorf("parked events: %w", err)
	}
	defer rows.Close()
	var out []Parked
	for rows.Next() {
		var (
			p   Parked
			raw []byte
		)
		if err := rows.Scan(&p.ID, &p.DeadLetterID, &raw); err != nil {
			return nil, fmt.Errorf("parked events: %w", err)
		}
		if p.Event, err = decodeEvent(raw); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("parked events: %w", err)
	}
	return out, nil
}

// ParkingDeadLetters returns the group's dead letters that park their
// hosts, oldest first, by id, with their hosts.
func ParkingDeadLetters(ctx context.Context, q schema.DB, group string, topic int) (map[int64][]string, []int64, error) {
	rows, err := q.Query(ctx, schema.SQL(ctx, parkingDeadLettersSQL), group, topic)
	if err != nil {
		return nil, nil, fmt.Errorf("parking dead letters: %w", err)
	}
	hosts := map[int64][]string{}
	var (
		order []int64
		id    int64
		hs    []string
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &hs}, func() error {
		hosts[id] = hs
		order = append(order, id)
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("parking dead letters: %w", err)
	}
	return hosts, order, nil
}

// Resolution is what resolving a dead letter leaves parked.
type Resolution struct {
	// DeadLetterID is the dead letter removed.
	DeadLetterID int64
	// Partitions is the partition count of the group's layout.
	Partitions int
	// Hosts maps every host still parked to a dead letter it waits behind.
	Hosts map[string]int64
	// Waiting maps the id of every event still parked to a dead letter it
	// waits behind.
	Waiting map[int64]int64
	// Released lists the ids of the parked events that were handled.
	Released []int64
}

// Resolve records, in tx (which holds LockGroup's locks), that a dead
// letter was replayed or discarded: the parked events that were handled
// go, the others and the parked hosts wait behind the dead letters r says,
// and the dead letter is removed.
func Resolve(ctx context.Context, tx pgx.Tx, group string, topic int, r Resolution) error {
	if _, err := tx.Exec(ctx, schema.SQL(ctx, clearParkedHostsSQL), group, topic); err != nil {
		return fmt.Errorf("resolve dead letter %d: %w", r.DeadLetterID, err)
	}
	hosts := make([]string, 0, len(r.Hosts))
	hostDLs := make([]int64, 0, len(r.Hosts))
	for h, dl := range r.Hosts {
		hosts, hostDLs = append(hosts, h), append(hostDLs, dl)
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, parkHostsAtSQL), group, topic, hosts, hostDLs, r.Partitions); err != nil {
		return fmt.Errorf("resolve dead letter %d: park hosts: %w", r.DeadLetterID, err)
	}
	offs := make([]int64, 0, len(r.Waiting))
	offDLs := make([]int64, 0, len(r.Waiting))
	for o, dl := range r.Waiting {
		offs, offDLs = append(offs, o), append(offDLs, dl)
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, reparkEventsSQL), group, topic, offs, offDLs); err != nil {
		return fmt.Errorf("resolve dead letter %d: park events: %w", r.DeadLetterID, err)
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, releaseParkedSQL), group, topic, r.Released); err != nil {
		return fmt.Errorf("resolve dead letter %d: release events: %w", r.DeadLetterID, err)
	}
	tag, err := tx.Exec(ctx, schema.SQL(ctx, deleteDeadLetterSQL), r.DeadLetterID)
	if err != nil {
		return fmt.Errorf("resolve dead letter %d: %w", r.DeadLetterID, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("dead letter %d: %w", r.DeadLetterID, ErrNoDeadLetter)
	}
	return nil
}

// RecordFailedReplay counts a failed replay of dead letter id.
func RecordFailedReplay(ctx context.Context, q schema.DB, id int64, reason string) error {
	if _, err := q.Exec(ctx, schema.SQL(ctx, failedReplaySQL), id, reason); err != nil {
		return fmt.Errorf("record failed replay: %w", err)
	}
	return nil
}

// decodeEvent reads an event as to_jsonb(outbox_message_t) writes it.
func decodeEvent(b []byte) (Event, error) {
	var ev Event
	if err := json.Unmarshal(b, &ev); err != nil {
		return Event{}, fmt.Errorf("decode stored event: %w", err)
	}
	normalize(&ev)
	return ev, nil
}

func decodeEvents(b []byte) ([]Event, error) {
	var evs []Event
	if err := json.Unmarshal(b, &evs); err != nil {
		return nil, fmt.Errorf("decode stored events: %w", err)
	}
	for i := range evs {
		normalize(&evs[i])
	}
	return evs, nil
}

// normalize turns a JSON null payload or metadata into nil, as a scan of
// the row gives.
func normalize(ev *Event) {
	if string(ev.Payload) == "null" {
		ev.Payload = nil
	}
	if string(ev.Metadata) == "null" {
		ev.Metadata = nil
	}
}
