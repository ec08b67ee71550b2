package adopt_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/adopt"
	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	pgSchema   = "pgevents"
	partitions = 4
)

// seed is a database holding a deployment of the seed design, and
// pgevents installed beside it in schema pgevents.
type seed struct {
	t     *testing.T
	ctx   context.Context // names pgevents' schema
	url   string
	app   *pgxpool.Pool // the application's sessions: the server's default search_path
	rng   *rand.Rand
	hosts []string
	users []string
}

func newSeed(t *testing.T) *seed {
	t.Helper()
	s := &seed{t: t, ctx: schema.WithName(context.Background(), pgSchema), url: pgtest.NewDB(t)}
	seedN := rand.Uint64()
	t.Logf("seed %d", seedN)
	s.rng = rand.New(rand.NewPCG(seedN, 7))
	s.app = pgtest.Pool(t, s.url)
	s.exec(pgtest.SeedTables)
	for range 9 {
		s.hosts = append(s.hosts, s.uuid())
	}
	for range 4 {
		s.users = append(s.users, s.uuid())
	}
	if _, err := schema.Migrate(s.ctx, s.app); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *seed) uuid() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(s.rng.IntN(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func (s *seed) exec(sql string, args ...any) {
	s.t.Helper()
	if _, err := s.app.Exec(context.Background(), sql, args...); err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
}

func (s *seed) int(sql string, args ...any) int64 {
	s.t.Helper()
	var n int64
	if err := s.app.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		s.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// produce appends txs transactions of 1 to 4 events the way the seed's
// producers do: offsets reserved from log_counter, rows inserted with them,
// one uuid transaction_id per transaction; a few users are NULL.
func (s *seed) produce(txs int) {
	s.t.Helper()
	for range txs {
		n := 1 + s.rng.IntN(4)
		hosts, users, types := make([]string, n), make([]*string, n), make([]string, n)
		for i := range n {
			hosts[i] = s.hosts[s.rng.IntN(len(s.hosts))]
			if s.rng.IntN(5) > 0 {
				users[i] = &s.users[s.rng.IntN(len(s.users))]
			}
			types[i] = []string{"UserCreated", "UserUpdated", "OrderPlaced"}[s.rng.IntN(3)]
		}
		s.exec(`WITH r AS (
    UPDATE log_counter SET next_offset = next_offset + $1 WHERE id = 1 RETURNING next_offset - $1 AS first
)
INSERT INTO outbox_message_t (id, host_id, user_id, nonce, aggregate_id, aggregate_type, event_type, payload,
                              transaction_id, correlation_id, c_offset)
SELECT gen_random_uuid(), u.h, u.usr, u.ord, 'agg-' || u.ord, 'User', u.typ, jsonb_build_object('n', u.ord),
       $5::uuid, CASE WHEN u.ord = 1 THEN 'corr' END, r.first + u.ord - 1
FROM r, unnest($2::uuid[], $3::uuid[], $4::text[]) WITH ORDINALITY AS u(h, usr, typ, ord)`,
			n, hosts, users, types, s.uuid())
	}
}

// oldEvent is a row of the old outbox, with the partition the seed's
// consumers compute for it.
type oldEvent struct {
	offset    int64
	partition int
	id        string
	host      string
}

func (s *seed) oldEvents() []oldEvent {
	s.t.Helper()
	rows, err := s.app.Query(context.Background(), fmt.Sprintf(`SELECT c_offset, abs(hashtext(host_id::text)) %% %d, id::text, host_id::text
FROM public.outbox_message_t WHERE c_offset IS NOT NULL ORDER BY c_offset`, partitions))
	if err != nil {
		s.t.Fatal(err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (oldEvent, error) {
		var e oldEvent
		return e, r.Scan(&e.offset, &e.partition, &e.id, &e.host)
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return evs
}

// consumePartWay gives each group a position in every partition, as the
// seed's consumers leave it after handling part of the log, and returns
// the events each group has not handled, in offset order.
func (s *seed) consumePartWay(groups []string) map[string][]oldEvent {
	s.t.Helper()
	evs := s.oldEvents()
	next := s.int(`SELECT next_offset FROM public.log_counter WHERE id = 1`)
	out := map[string][]oldEvent{}
	for _, g := range groups {
		pos := make([]int64, partitions)
		for p := range partitions {
			var offs []int64
			for _, e := range evs {
				if e.partition == p {
					offs = append(offs, e.offset)
				}
			}
			// Anywhere from nothing handled to everything handled.
			if i := s.rng.IntN(len(offs) + 1); i < len(offs) {
				pos[p] = offs[i]
			} else {
				pos[p] = next
			}
			s.exec(`INSERT INTO public.consumer_offsets (group_id, topic_id, partition_id, next_offset) VALUES ($1, 1, $2, $3)`, g, p, pos[p])
		}
		for _, e := range evs {
			if e.offset >= pos[e.partition] {
				out[g] = append(out[g], e)
			}
		}
	}
	return out
}

// handledTable records what pgevents' consumers handle.
const handledTable = `CREATE TABLE public.handled (
    seq          bigint GENERATED ALWAYS AS IDENTITY,
    group_id     text   NOT NULL,
    c_offset     bigint NOT NULL,
    partition_id int    NOT NULL,
    event_id     uuid   NOT NULL,
    host_id      text   NOT NULL
)`

// consume runs a pgevents consumer of group on the adopted topic until the
// test ends, logging to log when given.
func (s *seed) consume(group string, log ...*zerolog.Logger) *pgevents.Consumer {
	s.t.Helper()
	pc, err := pgevents.ParsePoolConfig(s.url)
	if err != nil {
		s.t.Fatal(err)
	}
	pc.MaxConns = int32(pgevents.PoolSize(partitions))
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		s.t.Fatal(err)
	}
	hs := &pgevents.Handlers{}
	hs.HandleAll(pgevents.SQLHandler(group, `INSERT INTO handled (group_id, c_offset, partition_id, event_id, host_id)
VALUES (@group_id, @c_offset, @partition_id, @event_id::uuid, @host_id)`))
	cfg := pgevents.Config{GroupID: group, TotalPartitions: partitions, BatchSize: 7,
		Schema: pgSchema, Handlers: hs, WaitPeriod: time.Second}
	if len(log) > 0 {
		cfg.Logger = log[0]
	}
	c, err := pgevents.NewConsumer(pool, cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	s.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			s.t.Errorf("consumer %s: %v", group, err)
		}
		pool.Close()
	})
	pgtest.WaitFor(s.t, 10*time.Second, "consumer "+group+" ready", c.Ready)
	return c
}

// handled returns what group handled, in the order it handled it.
func (s *seed) handled(group string) []oldEvent {
	s.t.Helper()
	rows, err := s.app.Query(context.Background(), `SELECT c_offset, partition_id, event_id::text, host_id FROM handled
WHERE group_id = $1 ORDER BY seq`, group)
	if err != nil {
		s.t.Fatal(err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (oldEvent, error) {
		var e oldEvent
		return e, r.Scan(&e.offset, &e.partition, &e.id, &e.host)
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return evs
}

// TestAdoptResumesEveryGroup is the adoption: a seed-style log consumed
// part way by three groups (the oldest events already removed by the old
// deployment, a few rows without an offset); after adopt, pgevents'
// consumers handle exactly the events each group had not handled, each
// once, in offset order per partition (so in order per host), the rows
// mapped as documented, and new appends continue the old offsets.
func TestAdoptResumesEveryGroup(t *testing.T) {
	t.Parallel()
	s := newSeed(t)
	s.produce(120)
	groups := []string{"billing", "search", "audit"}
	want := s.consumePartWay(groups)
	// The old deployment removed what every group had handled.
	low := s.int(`SELECT min(next_offset) FROM public.consumer_offsets`)
	s.exec(`DELETE FROM public.outbox_message_t WHERE c_offset < $1`, low)
	s.exec(`INSERT INTO public.outbox_message_t (id, host_id, event_type, payload) VALUES (gen_random_uuid(), $1, 'Legacy', '{}')`, s.hosts[0])
	oldNext := s.int(`SELECT next_offset FROM public.log_counter WHERE id = 1`)
	copies := s.int(`SELECT count(*) FROM public.outbox_message_t WHERE c_offset IS NOT NULL`)

	plan, err := adopt.Inspect(s.ctx, s.app, adopt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Problems) > 0 || plan.Options.Partitions != partitions || plan.Events != copies || plan.Unoffset != 1 || plan.NextOffset != oldNext {
		t.Fatalf("plan: problems %v, partitions %d (want %d), events %d (want %d), without offset %d (want 1), next %d (want %d)",
			plan.Problems, plan.Options.Partitions, partitions, plan.Events, copies, plan.Unoffset, plan.NextOffset, oldNext)
	}
	for _, g := range plan.Groups {
		if g.Unhandled != int64(len(want[g.ID])) {
			t.Fatalf("plan: group %s has %d events to handle, want %d", g.ID, g.Unhandled, len(want[g.ID]))
		}
	}
	if n := s.int(`SELECT count(*) FROM pgevents.outbox_message_t`); n != 0 {
		t.Fatalf("Inspect wrote %d events", n)
	}

	res, err := adopt.Adopt(s.ctx, s.app, adopt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Copied != copies {
		t.Fatalf("copied %d events, want %d", res.Copied, copies)
	}
	checkCopy(t, s)
	if n := s.int(`SELECT pgevents.topic_next_offset(1)`); n != oldNext {
		t.Fatalf("the topic's counter is at %d, want the old next_offset %d", n, oldNext)
	}
	if n := s.int(`SELECT count(*) FROM pgevents.consumer_offsets o JOIN public.consumer_offsets c
		ON c.group_id = o.group_id AND c.partition_id = o.partition_id AND c.next_offset = o.next_offset WHERE o.topic_id = 1`); n != int64(len(groups)*partitions) {
		t.Fatalf("%d positions copied one to one, want %d", n, len(groups)*partitions)
	}
	if _, err := adopt.Adopt(s.ctx, s.app, adopt.Options{}); !errors.Is(err, adopt.ErrRefused) || !strings.Contains(err.Error(), "adopted already") {
		t.Fatalf("second adopt: %v, want a refusal naming the first", err)
	}

	s.exec(handledTable)
	for _, g := range groups {
		s.consume(g)
	}
	total := 0
	for _, g := range groups {
		total += len(want[g])
	}
	waitCount(t, s, int64(total))
	for _, g := range groups {
		checkHandled(t, g, s.handled(g), want[g])
	}

	// New appends continue the offsets, and are handled by every group.
	tx, err := s.app.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	offs, err := pgevents.Append(s.ctx, tx, pgevents.Event{HostID: s.hosts[1], EventType: "After"}, pgevents.Event{HostID: s.hosts[2], EventType: "After"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(offs, []int64{oldNext, oldNext + 1}) {
		t.Fatalf("new appends got offsets %v, want %d and %d", offs, oldNext, oldNext+1)
	}
	waitCount(t, s, int64(total+2*len(groups)))
}

// checkCopy checks the mapping of every copied event against its old row.
func checkCopy(t *testing.T, s *seed) {
	t.Helper()
	bad := s.int(`SELECT count(*) FROM public.outbox_message_t o
LEFT JOIN pgevents.outbox_message_t m ON m.topic_id = 1 AND m.c_offset = o.c_offset
WHERE o.c_offset IS NOT NULL AND (
    m.c_offset IS NULL OR m.event_id <> o.id OR m.host_id <> o.host_id::text OR m.user_id <> coalesce(o.user_id::text, '')
    OR m.event_type <> o.event_type OR m.payload <> o.payload
    OR m.partition_id <> abs(hashtext(o.host_id::text)) % 4
    OR m.metadata->>'transaction_id' <> o.transaction_id::text
    OR (m.metadata->'nonce')::bigint <> o.nonce OR m.metadata->>'aggregate_id' <> o.aggregate_id
    OR m.metadata->>'aggregate_type' <> o.aggregate_type OR (m.metadata->'aggregate_version')::bigint <> o.aggregate_version
    OR m.metadata->>'correlation_id' IS DISTINCT FROM o.correlation_id OR NOT m.metadata ? 'correlation_id'
    OR (m.metadata->>'created_dt')::timestamptz <> o.created_dt)`)
	if bad != 0 {
		t.Fatalf("%d copied events differ from their old row", bad)
	}
	// One producer transaction, one transaction_id.
	if n := s.int(`SELECT count(*) FROM (SELECT o.transaction_id FROM public.outbox_message_t o
JOIN pgevents.outbox_message_t m ON m.topic_id = 1 AND m.c_offset = o.c_offset
GROUP BY 1 HAVING count(DISTINCT m.transaction_id) > 1) x`); n != 0 {
		t.Fatalf("%d old transactions map to several transaction ids", n)
	}
	if n := s.int(`SELECT count(*) FROM pgevents.outbox_message_t m JOIN pg_class c ON c.oid = m.tableoid WHERE c.relname LIKE '%default'`); n != 0 {
		t.Fatalf("%d events in a DEFAULT partition", n)
	}
}

func waitCount(t *testing.T, s *seed, n int64) {
	t.Helper()
	var got int64
	pgtest.WaitFor(t, 60*time.Second, fmt.Sprintf("%d events handled", n), func() bool {
		got = s.int(`SELECT count(*) FROM handled`)
		return got >= n
	})
	if got != n {
		t.Fatalf("%d events handled, want %d", got, n)
	}
}

// checkHandled compares what a group handled with what it had left: the
// same events, each once, in offset order within each partition.
func checkHandled(t *testing.T, group string, got, want []oldEvent) {
	t.Helper()
	seen := map[int64]bool{}
	last := map[int]int64{}
	for _, e := range got {
		if seen[e.offset] {
			t.Fatalf("group %s handled offset %d twice", group, e.offset)
		}
		seen[e.offset] = true
		if e.offset < last[e.partition] {
			t.Fatalf("group %s handled offset %d after %d in partition %d", group, e.offset, last[e.partition], e.partition)
		}
		last[e.partition] = e.offset
	}
	if len(got) != len(want) {
		t.Fatalf("group %s handled %d events, want the %d it had not handled", group, len(got), len(want))
	}
	for _, e := range want {
		if !seen[e.offset] {
			t.Fatalf("group %s did not handle offset %d (it had not before adopt)", group, e.offset)
		}
	}
	byOffset := map[int64]oldEvent{}
	for _, e := range got {
		byOffset[e.offset] = e
	}
	for _, e := range want {
		if h := byOffset[e.offset]; h.id != e.id || h.partition != e.partition || h.host != e.host {
			t.Fatalf("group %s: offset %d handled as %+v, the old row is %+v", group, e.offset, h, e)
		}
	}
}

// TestAdoptRefuses checks every refusal: it names the problem and writes
// nothing.
func TestAdoptRefuses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup func(s *seed)
		opts  adopt.Options
		want  string
	}{
		{"a hole a group has not handled", func(s *seed) {
			s.exec(`DELETE FROM public.outbox_message_t WHERE c_offset = (SELECT max(c_offset) - 3 FROM public.outbox_message_t)`)
		}, adopt.Options{}, "missing from"},
		{"a group without a position in a partition, and a removed prefix", func(s *seed) {
			s.exec(`DELETE FROM public.consumer_offsets WHERE group_id = 'g1' AND partition_id = 2`)
			s.exec(`DELETE FROM public.outbox_message_t WHERE c_offset = 1`)
		}, adopt.Options{Partitions: partitions}, "a group without a position in a partition starts there"},
		{"an offset beyond the counter", func(s *seed) {
			s.exec(`UPDATE public.log_counter SET next_offset = next_offset - 1`)
		}, adopt.Options{}, "at or beyond the counter"},
		{"a position beyond the counter", func(s *seed) {
			s.exec(`UPDATE public.consumer_offsets SET next_offset = 100000 WHERE group_id = 'g1' AND partition_id = 0`)
		}, adopt.Options{}, "beyond the counter"},
		{"a partition beyond the count", func(s *seed) {}, adopt.Options{Partitions: 2}, "outside 0..1"},
		{"a count the positions contradict", func(s *seed) {}, adopt.Options{Partitions: 8}, "ran with 4 partitions, not --partitions 8"},
		{"another topic in consumer_offsets", func(s *seed) {
			s.exec(`INSERT INTO public.consumer_offsets VALUES ('g1', 2, 0, 1)`)
		}, adopt.Options{Partitions: partitions}, "topic_id other than 1"},
		{"a topic with events", func(s *seed) {
			if _, _, err := schema.EnsureTopic(s.ctx, s.app, 1, partitions); err != nil {
				s.t.Fatal(err)
			}
			if _, err := pgevents.Append(s.ctx, s.app, pgevents.Event{HostID: "h", EventType: "x"}); err != nil {
				s.t.Fatal(err)
			}
		}, adopt.Options{}, "already has events"},
		{"a topic with other partitions", func(s *seed) {
			if _, _, err := schema.EnsureTopic(s.ctx, s.app, 1, 8); err != nil {
				s.t.Fatal(err)
			}
		}, adopt.Options{}, "exists with 8 partitions, not 4"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newSeed(t)
			s.produce(30)
			for _, g := range []string{"g1", "g2"} {
				for p := range partitions {
					s.exec(`INSERT INTO public.consumer_offsets VALUES ($1, 1, $2, 1)`, g, p)
				}
			}
			c.setup(s)
			_, err := adopt.Adopt(s.ctx, s.app, c.opts)
			if !errors.Is(err, adopt.ErrRefused) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("adopt: %v, want a refusal saying %q", err, c.want)
			}
			if n := s.int(`SELECT count(*) FROM pgevents.consumer_offsets`); n != 0 {
				t.Fatalf("a refused adopt wrote %d positions", n)
			}
		})
	}

	t.Run("partitions unknown", func(t *testing.T) {
		t.Parallel()
		s := newSeed(t)
		s.produce(5)
		_, err := adopt.Adopt(s.ctx, s.app, adopt.Options{})
		var unknown *adopt.PartitionsUnknownError
		if !errors.As(err, &unknown) || !strings.Contains(err.Error(), "--partitions") {
			t.Fatalf("adopt without positions: %v, want a PartitionsUnknownError asking for --partitions", err)
		}
		s.exec(`INSERT INTO public.consumer_offsets VALUES ('g1', 1, 0, 1), ('g1', 1, 1, 1), ('g2', 1, 0, 1)`)
		if _, err := adopt.Adopt(s.ctx, s.app, adopt.Options{}); !errors.As(err, &unknown) {
			t.Fatalf("adopt with groups in different partitions: %v, want a PartitionsUnknownError", err)
		}
		if _, err := adopt.Adopt(s.ctx, s.app, adopt.Options{Partitions: partitions}); err != nil {
			t.Fatalf("adopt with --partitions: %v", err)
		}
	})
}

// TestAdoptUnderProducers adopts while seed-style producers keep
// appending: they wait for the adoption, nothing they commit before it is
// lost, and what they commit after it reaches pgevents through the bridge.
func TestAdoptUnderProducers(t *testing.T) {
	t.Parallel()
	s := newSeed(t)
	s.produce(20)
	for p := range partitions {
		s.exec(`INSERT INTO public.consumer_offsets VALUES ('g', 1, $1, 1)`, p)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for ctx.Err() == nil {
				if _, err := s.app.Exec(context.Background(), `WITH r AS (
    UPDATE log_counter SET next_offset = next_offset + 1 WHERE id = 1 RETURNING next_offset - 1 AS o
)
INSERT INTO outbox_message_t (id, host_id, event_type, payload, c_offset)
SELECT gen_random_uuid(), $1::uuid, 'Produced', '{}', o FROM r`, s.hosts[rng.IntN(len(s.hosts))]); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	pgtest.WaitFor(t, 10*time.Second, "producers running", func() bool {
		return s.int(`SELECT count(*) FROM public.outbox_message_t`) > 40
	})
	if _, err := adopt.Adopt(s.ctx, s.app, adopt.Options{Bridge: true}); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 10*time.Second, "appends after adoption", func() bool {
		return s.int(`SELECT count(*) FROM public.outbox_message_t`) > s.int(`SELECT events FROM pgevents.adoptions`)+20
	})
	cancel()
	wg.Wait()
	// Every old event is in pgevents' log once, under its offset.
	if n := s.int(`SELECT count(*) FROM public.outbox_message_t o FULL JOIN pgevents.outbox_message_t m
		ON m.topic_id = 1 AND m.c_offset = o.c_offset AND m.event_id = o.id WHERE o.id IS NULL OR m.event_id IS NULL`); n != 0 {
		t.Fatalf("%d events of the old outbox and pgevents' log do not match one to one under the same offset", n)
	}
}

// TestBridge runs old producers (seed-style inserts into the old outbox)
// and new ones (pgevents.Append) side by side after adopt --bridge: every
// old row reaches pgevents' log once, with its id, in the order of the old
// offsets, one transaction id per old transaction; pgevents' consumer
// handles everything once, in order, and the old trigger's 'new_event'
// notifications wake it without a warning each. After Unbridge, new old
// rows no longer reach pgevents.
func TestBridge(t *testing.T) {
	t.Parallel()
	s := newSeed(t)
	s.produce(25)
	for p := range partitions {
		s.exec(`INSERT INTO public.consumer_offsets VALUES ('g', 1, $1, 1)`, p)
	}
	if _, err := adopt.Adopt(s.ctx, s.app, adopt.Options{Bridge: true}); err != nil {
		t.Fatal(err)
	}
	s.exec(handledTable)
	logs := logtest.New(t)
	log := zerolog.New(logs).Level(zerolog.TraceLevel)
	s.consume("g", &log)

	const txs = 80
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for i := range txs {
				n := 1 + rng.IntN(3)
				hosts := make([]string, n)
				for k := range hosts {
					hosts[k] = s.hosts[rng.IntN(len(s.hosts))]
				}
				var err error
				if w < 2 { // old producers
					_, err = s.app.Exec(context.Background(), `WITH r AS (
    UPDATE log_counter SET next_offset = next_offset + $1 WHERE id = 1 RETURNING next_offset - $1 AS first
)
INSERT INTO outbox_message_t (id, host_id, event_type, payload, transaction_id, c_offset)
SELECT gen_random_uuid(), u.h, 'Old', jsonb_build_object('i', $3::int), $4::uuid, r.first + u.ord - 1
FROM r, unnest($2::uuid[]) WITH ORDINALITY AS u(h, ord)`, n, hosts, i, fmt.Sprintf("00000000-0000-4000-8000-%012d", w*1000+i))
				} else { // a producer that moved to pgevents
					evs := make([]pgevents.Event, n)
					for k := range evs {
						evs[k] = pgevents.Event{HostID: hosts[k], EventType: "New"}
					}
					_, err = pgevents.Append(s.ctx, s.app, evs...)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	total := s.int(`SELECT count(*) FROM pgevents.outbox_message_t WHERE topic_id = 1`)
	waitCount(t, s, total)

	if n := s.int(`SELECT count(*) FROM public.outbox_message_t o FULL JOIN pgevents.outbox_message_t m
		ON m.topic_id = 1 AND m.event_id = o.id WHERE (o.id IS NULL AND m.event_type <> 'New') OR m.event_id IS NULL`); n != 0 {
		t.Fatalf("%d rows of the old outbox are not in pgevents' log exactly once", n)
	}
	if n := s.int(`SELECT count(*) FROM (
		SELECT o.c_offset AS old, lag(o.c_offset) OVER (ORDER BY m.c_offset) AS prev
		FROM pgevents.outbox_message_t m JOIN public.outbox_message_t o ON o.id = m.event_id) x
		WHERE old < prev`); n != 0 {
		t.Fatalf("%d bridged events out of the old offsets' order", n)
	}
	if n := s.int(`SELECT count(*) FROM (SELECT o.transaction_id FROM public.outbox_message_t o
		JOIN pgevents.outbox_message_t m ON m.event_id = o.id GROUP BY 1 HAVING count(DISTINCT m.transaction_id) > 1) x`); n != 0 {
		t.Fatalf("%d old transactions have several transaction ids in pgevents' log", n)
	}
	var log2 []oldEvent
	rows, err := s.app.Query(context.Background(), `SELECT c_offset, partition_id, event_id::text, host_id FROM pgevents.outbox_message_t WHERE topic_id = 1 ORDER BY c_offset`)
	if err != nil {
		t.Fatal(err)
	}
	if log2, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (oldEvent, error) {
		var e oldEvent
		return e, r.Scan(&e.offset, &e.partition, &e.id, &e.host)
	}); err != nil {
		t.Fatal(err)
	}
	checkHandled(t, "g", s.handled("g"), log2)
	out := logs.String()
	if n := strings.Count(out, "undecodable"); n != 0 {
		t.Fatalf("%d warnings for the old trigger's notifications:\n%s", n, out)
	}

	if err := adopt.Unbridge(s.ctx, s.app, adopt.Options{}); err != nil {
		t.Fatal(err)
	}
	s.produce(3)
	if n := s.int(`SELECT count(*) FROM pgevents.outbox_message_t WHERE topic_id = 1`); n != total {
		t.Fatalf("after unbridge, pgevents' log grew from %d to %d", total, n)
	}
	if err := adopt.Unbridge(s.ctx, s.app, adopt.Options{}); err == nil {
		t.Fatal("a second unbridge succeeded")
	}
}

// TestAdoptScript runs the SQL of --print as a team's migration tool
// would: it adopts like Adopt, refuses a second run, and refuses, under its
// own locks, a problem that arose after it was generated.
func TestAdoptScript(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSeed(t)
	s.produce(40)
	s.consumePartWay([]string{"a", "b"})
	plan, err := adopt.Inspect(s.ctx, s.app, adopt.Options{})
	if err != nil || len(plan.Problems) > 0 {
		t.Fatalf("inspect: %v %v", err, plan.Problems)
	}
	script := plan.Script()
	if !strings.HasPrefix(strings.TrimSpace(script[strings.Index(script, "BEGIN;"):]), "BEGIN;") || !strings.HasSuffix(script, "COMMIT;\n") {
		t.Fatalf("the script is not one transaction:\n%s", script)
	}
	s.produce(5) // the script reads the tables when it runs, not when it was printed
	if _, err := s.app.Exec(ctx, script); err != nil {
		t.Fatalf("running the script: %v", err)
	}
	checkCopy(t, s)
	if n, want := s.int(`SELECT pgevents.topic_next_offset(1)`), s.int(`SELECT next_offset FROM public.log_counter`); n != want {
		t.Fatalf("counter at %d, want %d", n, want)
	}
	if n := s.int(`SELECT count(*) FROM pgevents.consumer_offsets`); n != 2*partitions {
		t.Fatalf("%d positions, want %d", n, 2*partitions)
	}
	if _, err := s.app.Exec(ctx, script); err == nil || !strings.Contains(err.Error(), "adopted already") {
		t.Fatalf("running the script twice: %v, want a refusal", err)
	}

	s2 := newSeed(t)
	s2.produce(40)
	for p := range partitions { // nothing handled: any hole is one a group needs
		s2.exec(`INSERT INTO public.consumer_offsets VALUES ('a', 1, $1, 1)`, p)
	}
	plan2, err := adopt.Inspect(s2.ctx, s2.app, adopt.Options{})
	if err != nil || len(plan2.Problems) > 0 {
		t.Fatalf("inspect: %v %v", err, plan2.Problems)
	}
	s2.exec(`DELETE FROM public.outbox_message_t WHERE c_offset = (SELECT max(c_offset) FROM public.outbox_message_t)`)
	if _, err := s2.app.Exec(ctx, plan2.Script()); err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("the script after a hole appeared: %v, want a refusal naming it", err)
	}
	if n := s2.int(`SELECT count(*) FROM pgevents.outbox_message_t`); n != 0 {
		t.Fatalf("a refused script copied %d events", n)
	}
}
