package offsets

// Appending: the statements that put events in the log, from Go. The SQL
// functions they call (migrations 0006 and 0008) reserve the offsets under
// the append lock (invariant 1) and notify the waiting partitions.
const (
	// appendSQL appends a JSON array of events to one topic in the caller's
	// transaction; append_events reserves the offsets under the append
	// lock (invariant 1) and returns them, here in one array, in the
	// events' order.
	appendSQL = `SELECT coalesce(array_agg(o ORDER BY i), '{}') FROM {schema}append_events($1, $2) WITH ORDINALITY AS t(o, i)`

	// appendOneSQL appends one event (append_event), without the JSON array.
	appendOneSQL = `SELECT {schema}append_event($1, $2, $3, $4, $5, $6)`
)

// AppendSQL returns the statement, and its arguments, that appends the
// events in eventsJSON, a JSON array of objects with keys host_id, user_id,
// event_type, payload and metadata, to topic in the caller's transaction. It
// returns one row: the offsets, in array order (bigint[]). The statement
// names pgevents' functions after schema.Marker: run it through schema.SQL.
func AppendSQL(topic int, eventsJSON []byte) (string, []any) {
	return appendSQL, []any{topic, eventsJSON}
}

// AppendOneSQL returns the statement, and its arguments, that appends one
// event with append_event. It returns one row: the offset. payload and
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
