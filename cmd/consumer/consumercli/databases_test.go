package consumercli

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// TestRunGroupsOnTwoDatabases: one `consumer run` process serves group ga
// on the top level's database and group gb on another database, in a
// schema of its own (groups[1].databaseUrl, groups[1].schema), after one
// `consumer migrate` set up both. Events appended to each database are
// handled there, each exactly once, by its group only; /readyz is 200
// while both answer; the metrics count each group's events.
func TestRunGroupsOnTwoDatabases(t *testing.T) {
	t.Parallel()
	urlA, urlB := pgtest.NewDB(t), pgtest.NewDB(t)
	handler := fmt.Sprintf(`    handlers:
      - eventType: "*"
        type: sql
        statement: %q
`, strings.Join(strings.Fields(eventtest.RecordSQL), " "))
	cfg := writeConfig(t, fmt.Sprintf(`totalPartitions: 2
offsetScope: %s
waitPeriodMs: 1000
logLevel: info
logFormat: json
metricsAddr: "127.0.0.1:0"
groups:
  - groupId: ga
%s  - groupId: gb
    databaseUrl: %q
    schema: evb
%s`, pgtest.Scope(), handler, urlB, handler))
	if code, out := runOnce(t, urlA, "migrate", "--config", cfg); code != 0 {
		t.Fatalf("consumer migrate: exit %d\n%s", code, out)
	}
	poolA, poolB := pgtest.Pool(t, urlA), pgtest.Pool(t, urlB)
	for _, pool := range []*pgxpool.Pool{poolA, poolB} {
		eventtest.Exec(t, pool, eventtest.HandledTable)
	}
	// pgevents is in evb on B, and only there.
	var inB, inPublic bool
	if err := poolB.QueryRow(context.Background(), `SELECT to_regclass('evb.outbox_message_t') IS NOT NULL, to_regclass('public.outbox_message_t') IS NOT NULL`).Scan(&inB, &inPublic); err != nil {
		t.Fatal(err)
	}
	if !inB || inPublic {
		t.Fatalf("database B: pgevents in evb %v, in public %v; want evb only", inB, inPublic)
	}

	p := start(t, urlA, "run", "--config", cfg)
	base := "http://" + listenAddr(t, p.out)
	pgtest.WaitFor(t, 30*time.Second, "/readyz 200", func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == http.StatusOK
	})
	appendIn := func(ctx context.Context, pool *pgxpool.Pool, n int) {
		for i := range n {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := pgevents.Append(ctx, tx, pgevents.Event{HostID: fmt.Sprintf("h%d", i%7), EventType: "t", Payload: []byte(`{}`)})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	appendIn(context.Background(), poolA, 20)
	appendIn(schema.WithName(context.Background(), "evb"), poolB, 30)
	eventtest.WaitHandled(t, poolA, 20, 30*time.Second)
	eventtest.WaitHandled(t, poolB, 30, 30*time.Second)
	for _, pool := range []*pgxpool.Pool{poolA, poolB} {
		if d := eventtest.QueryInt(t, pool, `SELECT count(*) - count(DISTINCT (partition_id, c_offset)) FROM handled`); d != 0 {
			t.Fatalf("%d events handled twice", d)
		}
	}
	pgtest.WaitFor(t, 15*time.Second, "pgevents_events_handled_total: ga 20, gb 30", func() bool {
		_, body := httpGet(t, base+"/metrics")
		a, _ := metricSum(body, "pgevents_events_handled_total", `group="ga"`)
		b, _ := metricSum(body, "pgevents_events_handled_total", `group="gb"`)
		return a == 20 && b == 30
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("consumer exited %d after SIGTERM", code)
	}
}
