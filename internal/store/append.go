package store

// Appending: the statements that put events in the log, from Go. The SQL
// functions they call (migrations 0009 and 0010) take the offsets under the
// append locks (invariant 1), held to commit, and notify the partitions a
// consumer sleeps on.
const (
	// appendSQL appends a JSON array of events without idempotency keys to
	// one topic in the caller's transaction; append_many (which
	// append_events calls for such an array) takes the offsets under the
	// append locks (invariant 1) and returns them, here in one array, in
	// the events' order.
	//
	// To a sequenced topic (migration 0016) the events are staged instead,
	// by the statement itself rather than by stage_many: an INSERT and an
	// advisory try-lock, no PL/pgSQL call (which cost producers half their
	// rate, measured with pgbench). They are inserted in array order, so
	// their sequence numbers, returned, ascend in it. The sequencer's sleep
	// key is tried shared and held to commit (an append in flight); when a
	// sleeping sequencer holds it, the append notifies it (wake_sequencer).
	// For another topic, the CTEs insert nothing and append_many runs.
	appendSQL = `WITH c AS MATERIALIZED (
    SELECT lc.stage_gen FROM {schema}log_counter lc WHERE lc.topic_id = $1 AND lc.sequenced
), s AS (
    INSERT INTO {schema}staged_events (topic_id, gen, host_id, user_id, event_type, payload, metadata)
    SELECT $1, c.stage_gen, e.e->>'host_id', coalesce(e.e->>'user_id', ''), e.e->>'event_type',
           nullif(e.e->'payload', 'null'::jsonb), nullif(e.e->'metadata', 'null'::jsonb)
      FROM c, jsonb_array_elements($2::jsonb) WITH ORDINALITY AS e(e, ord)
     ORDER BY e.ord
    RETURNING seq
), staged AS (
    SELECT coalesce(array_agg(s.seq ORDER BY s.seq), '{}') AS seqs FROM s
)
SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM c)
            THEN (SELECT coalesce(array_agg(o ORDER BY i), '{}') FROM {schema}append_many($1, $2) WITH ORDINALITY AS t(o, i))
            WHEN pg_try_advisory_xact_lock_shared({schema}lock_key('sequencer', $1::integer || '/sleep')) THEN staged.seqs
            ELSE (SELECT staged.seqs FROM (SELECT pg_notify('pgevents_sequencer', $1::integer::text)) n) END
FROM staged`

	// appendOneSQL appends one event without an idempotency key
	// (append_one, which append_event calls for such an event), without the
	// JSON array; to a sequenced topic it stages it, as appendSQL does.
	appendOneSQL = `WITH c AS MATERIALIZED (
    SELECT lc.stage_gen FROM {schema}log_counter lc WHERE lc.topic_id = $1 AND lc.sequenced
), s AS (
    INSERT INTO {schema}staged_events (topic_id, gen, host_id, user_id, event_type, payload, metadata)
    SELECT $1, c.stage_gen, $2, coalesce($3, ''), $4, $5, $6 FROM c
    RETURNING seq
)
SELECT CASE WHEN s.seq IS NULL THEN {schema}append_one($1, $2, $3, $4, $5, $6)
            WHEN pg_try_advisory_xact_lock_shared({schema}lock_key('sequencer', $1::integer || '/sleep')) THEN s.seq
            ELSE (SELECT s.seq FROM (SELECT pg_notify('pgevents_sequencer', $1::integer::text)) n) END
FROM (SELECT 1) one LEFT JOIN s ON true`

	// appendKeyedSQL appends a JSON array of events whose elements may carry
	// an idempotency key (append_events_keyed), and returns three arrays in
	// the events' order: offsets, partitions, and whether each was a
	// duplicate of an event appended before with its key; for a sequenced
	// topic, sequence numbers and partitions -1 (append_results).
	appendKeyedSQL = `SELECT coalesce(array_agg(t.c_offset ORDER BY t.i), '{}'), coalesce(array_agg(t.partition_id ORDER BY t.i), '{}'),
       coalesce(array_agg(t.duplicate ORDER BY t.i), '{}')
FROM {schema}append_results($1, $2) WITH ORDINALITY AS t(c_offset, partition_id, duplicate, i)`
)

// AppendKeyedSQL returns the statement, and its arguments, that appends the
// events in eventsJSON (as AppendSQL, each object with an optional key
// idempotency_key) to topic in the caller's transaction. It returns one row:
// the offsets (bigint[]), partitions (integer[]) and duplicate flags
// (boolean[]), in array order. Run the statement through schema.SQL.
func AppendKeyedSQL(topic int, eventsJSON []byte) (string, []any) {
	return appendKeyedSQL, []any{topic, eventsJSON}
}

// AppendSQL returns the statement, and its arguments, that appends the
// events in eventsJSON, a JSON array of objects with keys host_id, user_id,
// event_type, payload and metadata (an idempotency_key is ignored: use
// AppendKeyedSQL), to topic in the caller's transaction. It
// returns one row: the offsets, in array order (bigint[]). The statement
// names pgevents' functions after schema.Marker: run it through schema.SQL.
func AppendSQL(topic int, eventsJSON []byte) (string, []any) {
	return appendSQL, []any{topic, eventsJSON}
}

// AppendOneSQL returns the statement, and its arguments, that appends one
// event, without an idempotency key. It returns one row: the offset. payload and
// metadata are JSON or nil. Run the statement through schema.SQL.
func AppendOneSQL(topic int, host, user, eventType string, payload, metadata []byte) (string, []any) {
	return appendOneSQL, []any{topic, host, user, eventType, jsonArg(payload), jsonArg(metadata)}
}

// jsonArg passes JSON text as a jsonb argument, nil as NULL.
func jsonArg(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}
