package pgevents

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// namedHandler is a handler told apart by its name.
type namedHandler string

func (namedHandler) Handle(context.Context, pgx.Tx, *Event) error { return nil }

// routes are the handlers of the routing tests, by pattern; the handler
// of a pattern is named after it.
var routes = []string{"user.created", "user.*", "user.admin.*", "*"}

// route is the pattern whose handler an event of type typ must reach
// under routes: the exact type, else the longest prefix, else "*".
var route = map[string]string{
	"user.created":       "user.created",
	"user.deleted":       "user.*",
	"user.created.v2":    "user.*", // an exact type is not a prefix
	"user.admin.added":   "user.admin.*",
	"user.admin.x.y":     "user.admin.*",
	"user.admin":         "user.*",
	"user":               "*",
	"users.created":      "*",
	"order.placed":       "*",
	"other":              "*",
	"user.*":             "user.*", // a type spelled as a pattern is matched as a type
	"xuser.admin.remove": "*",
}

// TestHandlersLookup: Lookup finds the handler of an event's exact type,
// else of the longest prefix pattern that matches, else of "*", and
// nothing without "*" for a type no pattern matches.
func TestHandlersLookup(t *testing.T) {
	hs := &Handlers{}
	for _, p := range routes {
		hs.Handle(p, namedHandler(p))
	}
	if hs.Len() != len(routes) {
		t.Errorf("Len = %d, want %d", hs.Len(), len(routes))
	}
	for typ, want := range route {
		h, ok := hs.Lookup(typ)
		if !ok || h != namedHandler(want) {
			t.Errorf("Lookup(%q) = %v, %v; want the handler of %q", typ, h, ok, want)
		}
	}

	noCatchAll := &Handlers{}
	noCatchAll.Handle("user.*", namedHandler("user.*"))
	for typ, want := range map[string]bool{"user.x": true, "user": false, "order.placed": false, "": false} {
		if _, ok := noCatchAll.Lookup(typ); ok != want {
			t.Errorf("without *: Lookup(%q) found a handler: %v, want %v", typ, ok, want)
		}
	}
}

// TestHandlersRefuseDuplicates: a second handler for one event type,
// prefix pattern or "*" (Handle, HandleFunc, HandleAll alike), a second
// group handler, and a pattern with a "*" elsewhere than a whole last
// segment make NewConsumer fail naming Config.Handlers and the pattern;
// the first registration stays.
func TestHandlersRefuseDuplicates(t *testing.T) {
	pool := &pgxpool.Pool{} // never used: validation comes first
	nop := func(context.Context, pgx.Tx, *Event) error { return nil }
	for _, tc := range []struct {
		name     string
		register func(hs *Handlers)
		msg      string
	}{
		{"one type twice", func(hs *Handlers) {
			hs.Handle("order.placed", namedHandler("a"))
			hs.HandleFunc("order.placed", nop)
		}, `two handlers for event type "order.placed"`},
		{"one pattern twice", func(hs *Handlers) {
			hs.Handle("user.*", namedHandler("a"))
			hs.Handle("order.*", namedHandler("b"))
			hs.Handle("user.*", namedHandler("c"))
		}, `two handlers for event type "user.*"`},
		{"HandleAll twice", func(hs *Handlers) {
			hs.HandleAll(namedHandler("a"))
			hs.HandleAll(namedHandler("b"))
		}, `two handlers for every event type ("*")`},
		{"HandleAll and *", func(hs *Handlers) {
			hs.Handle("*", namedHandler("a"))
			hs.HandleAll(namedHandler("b"))
		}, `two handlers for every event type ("*")`},
		{"two group handlers", func(hs *Handlers) {
			g := GroupHandlerFunc(func(context.Context, pgx.Tx, []Event) error { return nil })
			hs.HandleGroups(g)
			hs.HandleGroups(g)
		}, "two group handlers"},
		{"star inside a segment", func(hs *Handlers) { hs.Handle("us*er", namedHandler("a")) }, `"us*er" is not an event type or pattern`},
		{"star ending a segment", func(hs *Handlers) { hs.Handle("user*", namedHandler("a")) }, `"user*" is not an event type or pattern`},
		{"star not last", func(hs *Handlers) { hs.Handle("*.created", namedHandler("a")) }, `"*.created" is not an event type or pattern`},
		{"empty", func(hs *Handlers) { hs.Handle("", namedHandler("a")) }, "is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := &Handlers{}
			hs.Handle("known", namedHandler("known"))
			tc.register(hs)
			_, err := NewConsumer(pool, Config{GroupID: "g", TotalPartitions: 2, Handlers: hs})
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != "Handlers" || !strings.Contains(ce.Msg, tc.msg) {
				t.Fatalf("NewConsumer error %v, want a *ConfigError of Handlers saying %q", err, tc.msg)
			}
		})
	}
	hs := &Handlers{}
	hs.Handle("user.*", namedHandler("first"))
	hs.Handle("user.*", namedHandler("second"))
	if h, _ := hs.Lookup("user.created"); h != namedHandler("first") {
		t.Errorf("after a refused registration, user.created goes to %v, want the first handler", h)
	}
}

// TestEventTypeRouting: a consumer with handlers for an exact type,
// two nested prefix patterns and "*" handles each event of multi-event
// producer transactions over several hosts once, with the handler the
// precedence gives its type (exact, longest prefix, "*"), in each host's
// order.
func TestEventTypeRouting(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 4)
	mustExec(t, pool, `CREATE TABLE public.routed (
		seq        bigint GENERATED ALWAYS AS IDENTITY,
		pattern    text NOT NULL,
		c_offset   bigint NOT NULL,
		host_id    text NOT NULL,
		event_type text NOT NULL)`)
	hs := &Handlers{}
	for _, p := range routes {
		hs.Handle(p, SQLHandler("g", `INSERT INTO public.routed (pattern, c_offset, host_id, event_type)
			VALUES ('`+p+`', @c_offset, @host_id, @event_type)`))
	}
	startConsumer(t, pool, Config{TotalPartitions: 4, BatchSize: 7, Handlers: hs})

	// Keyed by host and offset: with partition-scoped offsets
	// (PGEVENTS_TEST_OFFSET_SCOPE), an offset is unique in its partition,
	// and a host's events all fall in one.
	types := slices.Sorted(maps.Keys(route))
	type at struct {
		host   string
		offset int64
	}
	typeAt := map[at]string{}
	for i := range 12 {
		evs := make([]Event, 5+i%4)
		for k := range evs {
			evs[k] = ev(fmt.Sprintf("host-%d", (i+k)%6), types[(i*7+k)%len(types)], `{}`)
		}
		for k, off := range appendTx(t, pool, evs...) {
			typeAt[at{evs[k].HostID, off}] = evs[k].EventType
		}
	}
	n := int64(len(typeAt))
	pgtest.WaitFor(t, 30*time.Second, "every event handled", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM public.routed`) >= n
	})

	rows, _ := pool.Query(context.Background(), `SELECT host_id, c_offset, event_type, pattern FROM public.routed ORDER BY seq`)
	type routed struct {
		Host      string
		Offset    int64
		EventType string
		Pattern   string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[routed])
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != n {
		t.Fatalf("%d handler calls for %d events", len(got), n)
	}
	seen := map[at]bool{}
	for _, r := range got {
		key := at{r.Host, r.Offset}
		if seen[key] {
			t.Errorf("event %d of %s handled twice", r.Offset, r.Host)
		}
		seen[key] = true
		if r.EventType != typeAt[key] {
			t.Errorf("event %d of %s handled as %q, appended as %q", r.Offset, r.Host, r.EventType, typeAt[key])
		}
		if want := route[r.EventType]; r.Pattern != want {
			t.Errorf("event %d of %s, type %q, went to the handler of %q, want %q", r.Offset, r.Host, r.EventType, r.Pattern, want)
		}
	}
	for typ := range route {
		if queryInt(t, pool, `SELECT count(*) FROM public.routed WHERE event_type = $1`, typ) == 0 {
			t.Errorf("no event of type %q was appended: the test misses a case", typ)
		}
	}
	if back := queryInt(t, pool, `SELECT count(*) FROM (SELECT c_offset, lag(c_offset) OVER (PARTITION BY host_id ORDER BY seq) AS prev
		FROM public.routed) s WHERE prev > c_offset`); back != 0 {
		t.Errorf("%d events handled before an earlier event of their host", back)
	}
}

// TestGroupHandlerReceivesRuns: a group handler gets each run of one
// (host, user) inside a unit at once, in order.
func TestGroupHandlerReceivesRuns(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	var (
		mu   sync.Mutex
		runs []string
	)
	hs := &Handlers{}
	hs.HandleGroups(GroupHandlerFunc(func(ctx context.Context, tx pgx.Tx, run []Event) error {
		var b strings.Builder
		for _, e := range run {
			fmt.Fprintf(&b, "%d%s/%s ", e.Offset, e.HostID, e.UserID)
		}
		mu.Lock()
		runs = append(runs, strings.TrimSpace(b.String()))
		mu.Unlock()
		return nil
	}))
	c := startConsumer(t, pool, Config{TotalPartitions: 1, Handlers: hs})
	u := func(host, user string) Event { return Event{HostID: host, UserID: user, EventType: "t"} }
	appendTx(t, pool, u("a", "1"), u("a", "1"), u("a", "2"), u("b", "1"), u("a", "2"))
	appendTx(t, pool, u("a", "2"))
	pgtest.WaitFor(t, 10*time.Second, "6 events handled", func() bool { return c.Stats().Handled == 6 })
	mu.Lock()
	defer mu.Unlock()
	want := []string{"1a/1 2a/1", "3a/2", "4b/1", "5a/2", "6a/2"}
	if fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Fatalf("runs %q, want %q", runs, want)
	}
}
