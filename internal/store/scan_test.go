package store

import (
	"strings"
	"testing"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// TestScanDecodesAsPgxDoes: the binary decoder of events gives exactly
// what pgx's scanning gives, for every column: NULL and big payloads,
// metadata, text beyond ASCII, times.
func TestScanDecodesAsPgxDoes(t *testing.T) {
	t.Parallel()
	ctx, url := setup(t, 3)
	pool := pgtest.Pool(t, url)
	big := `{"big":"` + strings.Repeat("x", 3*chunkSize) + `"}`
	if _, err := pool.Exec(ctx, `SELECT append_events(1, $1::jsonb)`, `[
		{"host_id":"h1","event_type":"t","payload":{"a":1}},
		{"host_id":"hôte-ü","user_id":"ユーザー","event_type":"type.é","payload":{"nested":{"x":[1,2,3]}},"metadata":{"m":"ü"}},
		{"host_id":"h3","event_type":"t"},
		{"host_id":"h4","event_type":"t","payload":`+big+`},
		{"host_id":"h5","event_type":"t","payload":"a string","metadata":null}
	]`); err != nil {
		t.Fatal(err)
	}
	const q = `SELECT ` + eventColumns + ` FROM outbox_message_t m ORDER BY m.partition_id, m.c_offset`
	rows, err := pool.Query(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fastEvents(rows); !ok {
		rows.Close()
		t.Fatal("the events are not in the formats the fast decoder reads: it is never used")
	}
	fast, err := scanEvents(rows, nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	generic, err := scanEventsGeneric(rows, nil, "test")
	rows.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(fast) != 5 || len(generic) != 5 {
		t.Fatalf("%d and %d events, want 5", len(fast), len(generic))
	}
	for i := range fast {
		f, g := fast[i], generic[i]
		if !f.CreatedAt.Equal(g.CreatedAt) || f.CreatedAt.Location() != g.CreatedAt.Location() {
			t.Errorf("event %d: created_at %v, pgx says %v", i, f.CreatedAt, g.CreatedAt)
		}
		f.CreatedAt = g.CreatedAt
		if f.Offset != g.Offset || f.TopicID != g.TopicID || f.PartitionID != g.PartitionID || f.EventID != g.EventID ||
			f.HostID != g.HostID || f.UserID != g.UserID || f.TransactionID != g.TransactionID || f.EventType != g.EventType ||
			string(f.Payload) != string(g.Payload) || string(f.Metadata) != string(g.Metadata) ||
			(f.Payload == nil) != (g.Payload == nil) || (f.Metadata == nil) != (g.Metadata == nil) {
			t.Errorf("event %d decoded as\n%+v\npgx says\n%+v", i, f, g)
		}
	}
}
