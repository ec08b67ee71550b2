package consumercli

import (
	"strings"
	"testing"

	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// adoptConfig is a configuration for pgevents in schema pgevents beside
// the seed's tables.
func adoptConfig(partitions string) string {
	return `schema: pgevents
groupId: billing
totalPartitions: ` + partitions + `
handlers:
  - eventType: "*"
    type: log
`
}

// TestAdoptCommand walks a team through `consumer migrate` and `consumer
// adopt` on a seed-style database: the schema beside the old tables, the
// dry run (nothing written), the printed SQL, the refusals with their exit
// statuses, the adoption, and the refusal to run twice.
func TestAdoptCommand(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	pool := pgtest.Pool(t, url)
	eventtest.Exec(t, pool, pgtest.SeedTables)
	eventtest.Exec(t, pool, `WITH r AS (UPDATE log_counter SET next_offset = next_offset + 30 WHERE id = 1 RETURNING next_offset - 30 AS first)
INSERT INTO outbox_message_t (id, host_id, user_id, event_type, payload, transaction_id, c_offset)
SELECT gen_random_uuid(), ('00000000-0000-4000-8000-00000000000' || (i % 7))::uuid, NULL, 'UserCreated',
       jsonb_build_object('i', i), gen_random_uuid(), r.first + i - 1
FROM r, generate_series(1, 30) AS i`)
	eventtest.Exec(t, pool, `INSERT INTO consumer_offsets (group_id, topic_id, partition_id, next_offset)
SELECT g, 1, p, 1 + p * 5 FROM unnest(ARRAY['billing', 'search']) AS g, generate_series(0, 3) AS p`)
	cfg := writeConfig(t, adoptConfig("4"))

	code, out := runOnce(t, url, "migrate", "--config", cfg)
	if code != 0 || !strings.Contains(out, "pgevents in schema pgevents") {
		t.Fatalf("migrate beside the seed's tables: exit %d\n%s", code, out)
	}

	code, out = runOnce(t, url, "adopt", "--config", cfg, "--dry-run")
	for _, want := range []string{"partitions:  4 (from \"public\".\"consumer_offsets\")", "30 to copy, offsets 1..30", "continues at offset 31",
		"host_id         <- o.host_id::text", "transaction_id", "billing: 4 positions", "dry run: nothing written"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("adopt --dry-run: exit %d, output lacks %q:\n%s", code, want, out)
		}
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM pgevents.outbox_message_t`); n != 0 {
		t.Fatalf("the dry run copied %d events", n)
	}

	code, out = runOnce(t, url, "adopt", "--config", cfg, "--print")
	if code != 0 || !strings.Contains(out, "BEGIN;") || !strings.HasSuffix(out, "COMMIT;\n") || !strings.Contains(out, `INSERT INTO "pgevents".outbox_message_t`) {
		t.Fatalf("adopt --print: exit %d\n%s", code, tail(out, 800))
	}

	code, out = runOnce(t, url, "adopt", "--config", writeConfig(t, adoptConfig("8")))
	if code != 2 || !strings.Contains(out, "totalPartitions") || !strings.Contains(out, "has 4 partitions") {
		t.Fatalf("adopt with totalPartitions 8: exit %d, want 2 naming totalPartitions\n%s", code, out)
	}
	code, out = runOnce(t, url, "adopt", "--config", cfg, "--old-topic", "2")
	if code != 2 || !strings.Contains(out, "--partitions N") {
		t.Fatalf("adopt where consumer_offsets cannot tell the partition count: exit %d, want 2 asking for --partitions\n%s", code, out)
	}

	code, out = runOnce(t, url, "adopt", "--config", cfg)
	if code != 0 || !strings.Contains(out, "30 events copied") {
		t.Fatalf("adopt: exit %d\n%s", code, out)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM pgevents.consumer_offsets o JOIN public.consumer_offsets c
		USING (group_id, partition_id, next_offset)`); n != 8 {
		t.Fatalf("%d positions carried over, want 8", n)
	}
	code, out = runOnce(t, url, "adopt", "--config", cfg)
	if code != 1 || !strings.Contains(out, "adopted already") {
		t.Fatalf("adopt twice: exit %d, want 1 and a refusal\n%s", code, out)
	}
}
