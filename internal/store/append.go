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
	// A sequenced topic's events are staged (stage_many, migration
	// 0016): the numbers returned are their sequence numbers.
	appendSQL = `SELECT CASE WHEN {schema}topic_sequenced($1)
            THEN (SELECT coalesce(array_agg(s.seq ORDER BY i), '{}') FROM {schema}stage_many($1, $2) WITH ORDINALITY AS s(seq, duplicate, i))
            ELSE (SELECT coalesce(array_agg(o ORDER BY i), '{}') FROM {schema}append_many($1, $2) WITH ORDINALITY AS t(o, i)) END`

	// appendOneSQL appends one event without an idempotency key
	// (append_one, which append_event calls for such an event), without the
	// JSON array.
	// A sequenced topic's event is staged (stage_one).
	appendOneSQL = `SELECT CASE WHEN {schema}topic_sequenced($1) THEN {schema}stage_one($1, $2, $3, $4, $5, $6, NULL)
            ELSE {schema}append_one($1, $2, $3, $4, $5, $6) END`

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
