package kafka_test

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/schema"
)

func TestMain(m *testing.M) {
	// A fuzzing worker runs the fuzz targets only, which need no database:
	// it starts none (the fuzzer restarts its workers, and a server start
	// each time would stall them).
	flag.Parse()
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		os.Exit(m.Run())
	}
	pgtest.Main(m)
}

// env is a migrated database with topic 1, a pool with the production
// settings, and an endpoint serving topic 1 as "events".
type env struct {
	t    testing.TB
	ctx  context.Context
	pool *pgxpool.Pool
	srv  *kafka.Server
	addr string
}

// newEnv starts an endpoint over a fresh topic of the given partitions
// and scope ("" for the suite's scope).
func newEnv(t testing.TB, partitions int, scope string, opts kafka.Options) *env {
	t.Helper()
	if scope == "" {
		scope = pgtest.Scope()
	}
	admin := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: partitions, Scope: scope})
	ctx := pgtest.Context(context.Background())
	pc, err := pgevents.ParsePoolConfig(admin.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	if sp, ok := admin.Config().ConnConfig.RuntimeParams["search_path"]; ok {
		pc.ConnConfig.RuntimeParams["search_path"] = sp
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := &env{t: t, ctx: ctx, pool: pool}
	e.srv, _ = e.gateway(opts)
	e.addr = e.srv.Addr().String()
	return e
}

// gateway starts another endpoint on the environment's database (its own
// pool); stop stops it and waits for it.
func (e *env) gateway(opts kafka.Options) (srv *kafka.Server, stop func()) {
	t := e.t
	t.Helper()
	pool := e.pool
	if e.srv != nil {
		pc := e.pool.Config().Copy()
		var err error
		if pool, err = pgxpool.NewWithConfig(e.ctx, pc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
	}
	opts.Listen = "127.0.0.1:0"
	if opts.Topics == nil {
		opts.Topics = map[string]int{"events": 1}
	}
	srv, err := kafka.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("kafka endpoint: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return srv, stop
}

// txEvent is one event a producer transaction appends.
type txEvent struct {
	host    string
	payload string
}

// produceRandom appends n producer transactions of 1 to 5 events over
// hosts host-0..host-(hosts-1), a third of them rolled back, drawn from
// seed; it returns the payloads committed, by host, in append order.
func (e *env) produceRandom(seed uint64, n, hosts int) map[string][]string {
	e.t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	out := map[string][]string{}
	for i := range n {
		var evs []pgevents.Event
		var tx []txEvent
		for j := range 1 + r.IntN(5) {
			h := fmt.Sprintf("host-%d", r.IntN(hosts))
			p := fmt.Sprintf(`{"i": %d, "tx": %d}`, j, i) // jsonb's own text form
			evs = append(evs, pgevents.Event{TopicID: 1, HostID: h, EventType: "test", Payload: []byte(p)})
			tx = append(tx, txEvent{h, p})
		}
		rollback := r.IntN(3) == 0
		t, err := e.pool.Begin(e.ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		if _, err := pgevents.Append(e.ctx, t, evs...); err != nil {
			e.t.Fatal(err)
		}
		if rollback {
			_ = t.Rollback(e.ctx)
			continue
		}
		if err := t.Commit(e.ctx); err != nil {
			e.t.Fatal(err)
		}
		for _, ev := range tx {
			out[ev.host] = append(out[ev.host], ev.payload)
		}
	}
	return out
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	pgtest.WaitFor(t, d, what, cond)
}

// request sends one request to the endpoint at addr on a connection of
// its own and returns the answer.
func request(t *testing.T, addr string, req kmsg.Request) kmsg.Response {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	id := "test"
	buf := kbin.AppendInt16(make([]byte, 4), req.Key())
	buf = kbin.AppendInt16(buf, req.GetVersion())
	buf = kbin.AppendInt32(buf, 1)
	buf = kbin.AppendNullableString(buf, &id)
	if req.IsFlexible() {
		buf = append(buf, 0)
	}
	buf = req.AppendTo(buf)
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
	if _, err := c.Write(buf); err != nil {
		t.Fatal(err)
	}
	size := make([]byte, 4)
	if _, err := io.ReadFull(c, size); err != nil {
		t.Fatalf("request %d: %v", req.Key(), err)
	}
	body := make([]byte, binary.BigEndian.Uint32(size))
	if _, err := io.ReadFull(c, body); err != nil {
		t.Fatal(err)
	}
	resp := req.ResponseKind()
	body = body[4:] // correlation id
	if resp.IsFlexible() && req.Key() != 18 {
		body = body[1:] // empty tags
	}
	if err := resp.ReadFrom(body); err != nil {
		t.Fatalf("response %d: %v", req.Key(), err)
	}
	return resp
}

// portOf returns addr's port.
func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
