package consumercli

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

var serviceBinaries built

// serviceBinary builds the example service, example-service (a
// consumercli.CLI with two Go handlers, as a service writes its own
// consumer binary), once per test run, and returns its path.
func serviceBinary(t *testing.T) string {
	t.Helper()
	return filepath.Join(serviceBinaries.build(t, map[string]string{"example-service": "./example-service"}), "example-service")
}

// serviceTables is the example service's own table (see its package
// documentation).
const serviceTables = `CREATE TABLE invoices (
	order_id   bigint PRIMARY KEY,
	customer   text   NOT NULL,
	amount     bigint NOT NULL,
	placed_at  bigint NOT NULL,
	shipped_at bigint,
	shipments  int    NOT NULL DEFAULT 0
)`

// serviceConfig is the example service's db-event-consumer.yml: its two Go
// handlers, bound by the names it registered them under, beside a built-in
// one.
func serviceConfig(partitions int) string {
	return fmt.Sprintf(`groupId: billing
totalPartitions: %d
offsetScope: %s
waitPeriodMs: 1000
leaseMs: 1000
logLevel: info
logFormat: json
metricsAddr: "127.0.0.1:0"
unknownEventType: fail
handlers:
  - eventType: order.placed
    type: go
    name: invoices
  - eventType: order.shipped
    type: go
    name: shipments
  - eventType: order.noted
    type: sql
    statement: SELECT 1
`, partitions, pgtest.Scope())
}

// TestServiceBinary builds the example service's binary and runs it as a
// deployment would: `migrate` with it, two replicas of `run`, producers
// appending orders (placed, then shipped, in transactions of several
// orders) for 40 customers. Every order must be invoiced once by one Go
// handler and shipped once by the other, after it was placed (a
// customer's events in order), with nothing dead-lettered; each replica
// serves /readyz and /metrics, which count every event handled; `status
// --json` of the same binary shows the group caught up; `dlq replay` runs
// the Go handlers; SIGTERM ends both replicas with status 0.
func TestServiceBinary(t *testing.T) {
	t.Parallel()
	svc := serviceBinary(t)
	url := pgtest.NewDB(t)
	cfg := writeConfig(t, serviceConfig(4))
	if code, out := runBinary(t, svc, url, "migrate", "--config", cfg); code != 0 {
		t.Fatalf("example-service migrate: exit %d\n%s", code, out)
	}
	pool := pgtest.Pool(t, url)
	eventtest.Exec(t, pool, serviceTables)

	replicas := []*proc{startBinary(t, svc, url, "run", "--config", cfg), startBinary(t, svc, url, "run", "--config", cfg)}
	var bases []string
	for _, p := range replicas {
		base := "http://" + listenAddr(t, p.out)
		pgtest.WaitFor(t, 20*time.Second, "/readyz 200", func() bool {
			code, _ := httpGet(t, base+"/readyz")
			return code == http.StatusOK
		})
		bases = append(bases, base)
	}

	const producers, perProducer, customers = 4, 100, 40
	orders := appendOrders(t, pool, producers, perProducer, customers)
	pgtest.WaitFor(t, 60*time.Second, "every order invoiced and shipped", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM invoices WHERE shipments > 0`) == orders ||
			eventtest.QueryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`) > 0
	})
	if dl := eventtest.QueryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); dl != 0 {
		t.Fatalf("%d dead letters: an order handled twice, or shipped before it was placed", dl)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM invoices`); n != orders {
		t.Fatalf("%d invoices, want %d", n, orders)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM invoices WHERE shipments <> 1 OR shipped_at <= placed_at`); n != 0 {
		t.Fatalf("%d orders shipped more than once, or before they were placed", n)
	}

	// Each replica counts what it handled; together, every event once
	// (the orders placed and shipped, and the notes the built-in handler
	// took).
	events := eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t`)
	if events <= 2*orders {
		t.Fatalf("%d events in the log for %d orders: no note among them", events, orders)
	}
	pgtest.WaitFor(t, 10*time.Second, fmt.Sprintf("pgevents_events_handled_total = %d over the replicas", events), func() bool {
		var total float64
		for _, base := range bases {
			_, body := httpGet(t, base+"/metrics")
			n, _ := metricSum(body, "pgevents_events_handled_total", `group="billing"`)
			total += n
		}
		return total == float64(events)
	})

	code, out := runBinary(t, svc, url, "status", "--json", "--config", cfg)
	if code != 0 {
		t.Fatalf("example-service status --json: exit %d\n%s", code, out)
	}
	var doc statusJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, out)
	}
	if len(doc.Partitions) != 4 {
		t.Fatalf("status: %d partitions, want 4\n%s", len(doc.Partitions), out)
	}
	for _, p := range doc.Partitions {
		if p.GroupID != "billing" || p.LagEvents != 0 || p.DeadLettersOpen != 0 || p.Lease == nil {
			t.Errorf("status of partition %d: %s, want group billing caught up, leased, no dead letters", p.PartitionID, dump(p))
		}
	}

	// An order shipped that was never placed is dead-lettered by the Go
	// handler; once the order exists, dlq replay runs the Go handler again.
	appendTx(t, pool, orderEvent("late", "order.shipped", 1_000_000))
	pgtest.WaitFor(t, 20*time.Second, "the early shipment dead-lettered", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`) == 1
	})
	eventtest.Exec(t, pool, `INSERT INTO invoices (order_id, customer, amount, placed_at) VALUES (1000000, 'late', 1, 0)`)
	if code, out := runBinary(t, svc, url, "dlq", "replay", "--all", "--config", cfg); code != 0 {
		t.Fatalf("example-service dlq replay: exit %d\n%s", code, out)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT shipments FROM invoices WHERE order_id = 1000000`); n != 1 {
		t.Fatalf("after dlq replay, the order was shipped %d times, want 1", n)
	}

	for _, p := range replicas {
		if code := p.stop(t, 15*time.Second); code != 0 {
			t.Errorf("example-service exited with %d after SIGTERM, want 0", code)
		}
	}
}

// TestUnregisteredGoHandlerExitsTwo: a file whose handler of type go names
// a handler the binary did not register is refused before anything runs,
// with status 2, naming the key and what is registered; the stock binary
// has none.
func TestUnregisteredGoHandlerExitsTwo(t *testing.T) {
	t.Parallel()
	url := pgtest.Server(t)
	unknown := strings.Replace(serviceConfig(4), "name: shipments", "name: shipping", 1)
	code, out := runBinary(t, serviceBinary(t), url, "run", "--config", writeConfig(t, unknown))
	if code != 2 || !strings.Contains(out, "handlers[1].name") || !strings.Contains(out, `"shipping"`) ||
		!strings.Contains(out, `registered: "invoices", "shipments"`) {
		t.Fatalf("example-service with an unregistered handler: exit %d, want 2 naming handlers[1].name and the registered ones:\n%s", code, out)
	}
	grouped := "groups:\n  - groupId: a\n    handlers: [{eventType: x, type: log}]\n  - groupId: b\n    handlers: [{eventType: x, type: go, name: invoices}]\n"
	for name, yaml := range map[string]string{"top level": serviceConfig(4), "second group": grouped} {
		key := map[string]string{"top level": "handlers[0].name", "second group": "groups[1].handlers[0].name"}[name]
		code, out := runOnce(t, url, "run", "--config", writeConfig(t, yaml))
		if code != 2 || !strings.Contains(out, key) || !strings.Contains(out, "this binary has none") {
			t.Errorf("%s: the stock binary with a Go handler: exit %d, want 2 naming %s:\n%s", name, code, key, out)
		}
	}
}

// appendOrders appends, from producers goroutines, perProducer orders
// each for customers customers: a transaction places one to three orders,
// and ships the orders the producer placed before them. It returns the
// number of orders, every one placed and shipped.
func appendOrders(t *testing.T, pool *pgxpool.Pool, producers, perProducer, customers int) int64 {
	t.Helper()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p), 7))
			var placed []pgevents.Event // placed, not shipped yet
			for k := 0; k < perProducer; {
				var evs []pgevents.Event
				for range 1 + rng.IntN(3) {
					if k == perProducer {
						break
					}
					id := int64(p*perProducer + k)
					k++
					ev := orderEvent(fmt.Sprintf("c%d", rng.IntN(customers)), "order.placed", id)
					evs = append(evs, ev)
					placed = append(placed, ev)
				}
				if rng.IntN(4) == 0 { // an event no Go handler takes: the built-in one does
					evs = append(evs, pgevents.Event{HostID: evs[0].HostID, EventType: "order.noted", Payload: []byte(`{}`)})
				}
				if !appendTx(t, pool, evs...) {
					return
				}
				// Ship what was placed in earlier transactions.
				if n := len(placed) - len(evs); n > 0 {
					var ships []pgevents.Event
					for _, ev := range placed[:n] {
						ship := ev
						ship.EventType = "order.shipped"
						ships = append(ships, ship)
					}
					placed = placed[n:]
					if !appendTx(t, pool, ships...) {
						return
					}
				}
			}
			var ships []pgevents.Event
			for _, ev := range placed {
				ev.EventType = "order.shipped"
				ships = append(ships, ev)
			}
			appendTx(t, pool, ships...)
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return int64(producers * perProducer)
}

// orderEvent is an order event of customer's.
func orderEvent(customer, eventType string, id int64) pgevents.Event {
	return pgevents.Event{HostID: customer, EventType: eventType,
		Payload: []byte(fmt.Sprintf(`{"order_id": %d, "amount": %d}`, id, 100+id%7))}
}

// appendTx appends evs in one transaction, reporting a failure to t.
func appendTx(t *testing.T, pool *pgxpool.Pool, evs ...pgevents.Event) bool {
	if len(evs) == 0 {
		return true
	}
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := pgevents.Append(context.Background(), tx, evs...)
		return err
	})
	if err != nil {
		t.Errorf("append: %v", err)
	}
	return err == nil
}
