package consumercli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/offsets"
)

// auditRows returns the rows of console_audit, oldest first, as "origin
// actor action detail | outcome".
func auditRows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT origin || ' ' || actor || ' ' || action || ' ' || detail || ' | ' || outcome
		FROM console_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPauseResumeIdempotentAudited: pausing a paused group and resuming
// an active one exit 0 and say the group was so already; every pause,
// resume and reset of the CLI is in console_audit with origin cli and the
// OS user@host as actor; a refused action is recorded as failed, and its
// message names no Go package. A forced reset of a running replica's
// group is logged once, as a reset, not as leases lost to another replica.
func TestPauseResumeIdempotentAudited(t *testing.T) {
	t.Parallel()
	url, pool := migrated(t, 8)
	cfg := writeConfig(t, strings.Replace(recordingConfig(8, -1, 10), "logLevel: warn", "logLevel: info", 1))
	p := start(t, url, "run", "--config", cfg)
	pgtest.WaitFor(t, 20*time.Second, "every partition leased", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_leases WHERE group_id = 'g' AND owner <> ''`) == 8
	})

	for _, step := range []struct{ args, want string }{
		{"group pause g", "group g on topic 1: ACTIVE -> PAUSED"},
		{"group pause g", "group g on topic 1 was already PAUSED: nothing changed"},
		{"group resume g", "group g on topic 1: PAUSED -> ACTIVE"},
		{"group resume g", "group g on topic 1 was already ACTIVE: nothing changed"},
	} {
		code, out := runOnce(t, url, append(strings.Fields(step.args), "--config", cfg)...)
		if code != 0 || !strings.Contains(out, step.want) {
			t.Fatalf("%s: exit %d, want 0 saying %q\n%s", step.args, code, step.want, out)
		}
	}
	code, out := runOnce(t, url, "group", "pause", "nobody", "--config", cfg)
	if code != 1 || !strings.Contains(out, `group "nobody" has no subscription on topic 1`) || strings.Contains(out, "offsets:") {
		t.Fatalf("pause of a group without a subscription: exit %d, want 1 without a package name\n%s", code, out)
	}
	if code, out := runOnce(t, url, "offsets", "reset", "--group", "g", "--to", "latest", "--force", "--config", cfg); code != 0 {
		t.Fatalf("forced reset: exit %d\n%s", code, out)
	}
	const resetLog = "the group's positions were reset by an operator"
	pgtest.WaitFor(t, 20*time.Second, "the replica logs the reset", func() bool { return strings.Contains(p.out.String(), resetLog) })
	pgtest.WaitFor(t, 20*time.Second, "the partitions leased again", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_leases WHERE group_id = 'g' AND owner <> ''`) == 8
	})
	logs := p.out.String()
	if n := strings.Count(logs, resetLog); n != 1 || strings.Contains(logs, "lost to another replica") {
		t.Errorf("a forced reset with one replica logged %d reset lines (want 1) and lost leases %d times (want 0):\n%s",
			n, strings.Count(logs, "lost to another replica"), logs)
	}

	actor := cliActor()
	want := []string{
		"cli " + actor + " pause ACTIVE -> PAUSED | ok",
		"cli " + actor + " pause already PAUSED | ok",
		"cli " + actor + " resume PAUSED -> ACTIVE | ok",
		"cli " + actor + " resume already ACTIVE | ok",
		"cli " + actor + ` pause  | failed: group "nobody" has no subscription on topic 1`,
		"cli " + actor + " reset to latest (forced): partition 0 ",
	}
	got := auditRows(t, pool)
	if len(got) != len(want) {
		t.Fatalf("audit rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("audit row %d: %q, want %q…", i, got[i], want[i])
		}
	}
	if !strings.Contains(actor, "@") {
		t.Errorf("the CLI's actor %q is not user@host", actor)
	}
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}

// TestOffsetsShow: `offsets show` prints each group's position, log end
// and lag per partition, as offsets.Positions reads them, as a table and
// with --json; a partition without a position shows "-"; --group shows
// one group.
func TestOffsetsShow(t *testing.T) {
	t.Parallel()
	url, pool, _ := statusFixture(t) // groups g (every partition) and h (partition 2 only), 4 partitions
	cfg := writeConfig(t, fmt.Sprintf(`offsetScope: %s
groups:
  - groupId: g
    totalPartitions: 4
    handlers: [{eventType: "*", type: log}]
  - groupId: h
    totalPartitions: 4
    handlers: [{eventType: "*", type: log}]
`, pgtest.Scope()))
	code, out := runOnce(t, url, "offsets", "show", "--json", "--config", cfg)
	if code != 0 {
		t.Fatalf("offsets show --json: exit %d\n%s", code, out)
	}
	var shown []shownPosition
	if err := json.Unmarshal([]byte(out), &shown); err != nil {
		t.Fatalf("offsets show --json is not JSON: %v\n%s", err, out)
	}
	var want []shownPosition
	for _, g := range []string{"g", "h"} {
		ps, err := offsets.Positions(context.Background(), pool, g, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			s := shownPosition{Group: g, Topic: 1, Partition: p.Partition, LogEnd: p.LogEnd, Lag: p.Lag, LagCapped: p.LagCapped}
			if p.Next >= 0 {
				s.Position = &p.Next
			}
			want = append(want, s)
		}
	}
	if len(shown) != 8 || dump(shown) != dump(want) {
		t.Fatalf("offsets show --json:\n%s\nwant:\n%s", dump(shown), dump(want))
	}
	if shown[4].Position != nil || shown[6].Position == nil || shown[0].Lag == 0 || shown[1].Lag != 0 || shown[1].LogEnd == 0 {
		t.Fatalf("the fixture's positions are not what the test expects (h in partition 2 only, g behind in 0, caught up in 1):\n%s", dump(shown))
	}

	code, out = runOnce(t, url, "offsets", "show", "--group", "h", "--config", cfg)
	if code != 0 {
		t.Fatalf("offsets show --group h: exit %d\n%s", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !slices.Equal(strings.Fields(lines[0]), []string{"GROUP", "TOPIC", "PARTITION", "POSITION", "LOG", "END", "LAG"}) {
		t.Fatalf("offsets show --group h:\n%s", out)
	}
	for i, l := range lines[1:] {
		w := want[4+i]
		pos, lag := "-", "-"
		if w.Position != nil {
			pos, lag = fmt.Sprint(*w.Position), fmt.Sprint(w.Lag)
		}
		if f := strings.Fields(l); !slices.Equal(f, []string{"h", "1", fmt.Sprint(i), pos, fmt.Sprint(w.LogEnd), lag}) {
			t.Errorf("line %q, want h 1 %d %s %d %s", l, i, pos, w.LogEnd, lag)
		}
	}
	if code, out := runOnce(t, url, "offsets", "show", "extra", "--config", cfg); code != 2 {
		t.Errorf("offsets show extra: exit %d, want 2\n%s", code, out)
	}
}

// TestDLQListHostAndTypeAudited: `dlq list` shows each dead letter's hosts
// and event types, in the table and the JSON; `dlq discard` is in the
// audit with origin cli, the dead letter and its group, topic and
// partition.
func TestDLQListHostAndTypeAudited(t *testing.T) {
	t.Parallel()
	url, pool := migrated(t, 4)
	cfg := writeConfig(t, recordingConfig(4, -1, 10))
	ctx := context.Background()
	if err := store.Init(ctx, pool, "g", 1, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	var first int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		offs, err := pgevents.Append(ctx, tx,
			pgevents.Event{HostID: "shop-7", EventType: "order.placed", Payload: []byte(`{}`)},
			pgevents.Event{HostID: "shop-7", EventType: "order.shipped", Payload: []byte(`{}`)})
		first = offs[0]
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	eventtest.Exec(t, pool, `INSERT INTO dead_letter_queue (group_id, topic_id, partition_id, first_offset, last_offset,
		transaction_id, event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at)
		SELECT 'g', 1, min(partition_id), min(c_offset), max(c_offset), min(transaction_id), array_agg(event_id ORDER BY c_offset),
		       ARRAY['shop-7'], jsonb_agg(to_jsonb(m) ORDER BY c_offset), 'boom', 1, now(), now()
		FROM outbox_message_t m WHERE c_offset >= $1`, first)
	id := eventtest.QueryInt(t, pool, `SELECT id FROM dead_letter_queue`)
	partition := eventtest.QueryInt(t, pool, `SELECT partition_id FROM dead_letter_queue`)

	code, out := runOnce(t, url, "dlq", "list", "--config", cfg)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.Contains(lines[0], "HOST") || !strings.Contains(lines[0], "EVENT TYPE") ||
		!strings.Contains(lines[1], " shop-7 ") || !strings.Contains(lines[1], " order.placed,order.shipped ") {
		t.Fatalf("dlq list: exit %d, want the host and the event types\n%s", code, out)
	}
	code, out = runOnce(t, url, "dlq", "list", "--json", "--config", cfg)
	var dls []pgevents.DeadLetter
	if err := json.Unmarshal([]byte(out), &dls); code != 0 || err != nil || len(dls) != 1 ||
		!slices.Equal(dls[0].HostIDs, []string{"shop-7"}) || !slices.Equal(dls[0].EventTypes, []string{"order.placed", "order.shipped"}) {
		t.Fatalf("dlq list --json: exit %d (%v)\n%s", code, err, out)
	}

	if code, out := runOnce(t, url, "dlq", "discard", fmt.Sprint(id), "--config", cfg); code != 0 {
		t.Fatalf("dlq discard: exit %d\n%s", code, out)
	}
	var got string
	if err := pool.QueryRow(ctx, `SELECT concat_ws(' ', origin, actor, action, dead_letter_id, group_id, topic_id, partition_id, outcome)
		FROM console_audit`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("cli %s discard %d g 1 %d ok: 0 events handled", cliActor(), id, partition); got != want {
		t.Fatalf("audit of the discard: %q, want %q", got, want)
	}
}

// TestMigrateChecks: migrate needs no console token (it never serves the
// console; run, which does, refuses the file naming console.token), and
// refuses a file naming a Go handler the binary did not register, with
// status 2 naming the key, before it creates anything.
func TestMigrateChecks(t *testing.T) {
	t.Setenv(config.EnvConsoleToken, "")
	url := pgtest.NewDB(t)
	noToken := recordingConfig(2, -1, 10) + "console: {listen: '127.0.0.1:0', token: '${CONSOLE_TOKEN_NOT_SET_HERE}'}\n"
	if code, out := runOnce(t, url, "migrate", "--config", writeConfig(t, noToken)); code != 0 {
		t.Fatalf("migrate without the console's token: exit %d, want 0\n%s", code, out)
	}
	if code, out := runOnce(t, url, "run", "--config", writeConfig(t, noToken)); code != 2 || !strings.Contains(out, "console.token") {
		t.Fatalf("run without the console's token: exit %d, want 2 naming console.token\n%s", code, out)
	}

	fresh := pgtest.NewDB(t)
	unknown := strings.Replace(serviceConfig(4), "name: shipments", "name: shipping", 1)
	code, out := runBinary(t, serviceBinary(t), fresh, "migrate", "--config", writeConfig(t, unknown))
	if code != 2 || !strings.Contains(out, "handlers[1].name") || !strings.Contains(out, `"shipping"`) {
		t.Fatalf("example-service migrate with an unregistered Go handler: exit %d, want 2 naming handlers[1].name\n%s", code, out)
	}
	code, out = runOnce(t, fresh, "migrate", "--config", writeConfig(t, serviceConfig(4)))
	if code != 2 || !strings.Contains(out, "handlers[0].name") || !strings.Contains(out, "this binary has none") {
		t.Fatalf("consumer migrate with a Go handler: exit %d, want 2 naming handlers[0].name\n%s", code, out)
	}
	pool := pgtest.Pool(t, fresh)
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename = 'outbox_message_t'`); n != 0 {
		t.Fatal("a refused migrate created the schema")
	}
}

// TestBinaryName: the usage, the messages and `version` call the binary
// by its name: CLI.Name, else the running binary's file name (a service's
// own binary calls itself by its own).
func TestBinaryName(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	cli := &CLI{Name: "billing-consumer"}
	if code := cli.Main(t.Context(), nil, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "usage: billing-consumer <command>") ||
		!strings.Contains(stderr.String(), "Run 'billing-consumer <command> -h'") || strings.Contains(stderr.String(), "usage: consumer") {
		t.Errorf("usage of billing-consumer: exit %d\n%s", code, stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := cli.Main(t.Context(), []string{"version"}, &stdout, &stderr); code != exitOK || !strings.HasPrefix(stdout.String(), "billing-consumer ") {
		t.Errorf("billing-consumer version: exit %d\n%s", code, stdout.String())
	}
	stderr.Reset()
	if code := cli.Main(t.Context(), []string{"offsets"}, &stdout, &stderr); code != exitUsage ||
		!strings.Contains(stderr.String(), "billing-consumer offsets show") || strings.Contains(stderr.String(), " consumer ") {
		t.Errorf("billing-consumer offsets: exit %d\n%s", code, stderr.String())
	}

	svc := serviceBinary(t)
	url := pgtest.Server(t)
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"version"}, 0, "example-service "},
		{nil, 2, "usage: example-service <command>"},
		{[]string{"nope"}, 2, `example-service: unknown command "nope"`},
		{[]string{"group", "pause"}, 2, "usage: example-service group pause"},
	} {
		code, out := runBinary(t, svc, url, tt.args...)
		if code != tt.code || !strings.Contains(out, tt.want) || strings.Contains(out, "consumer:") || strings.Contains(out, "usage: consumer") {
			t.Errorf("example-service %v: exit %d, want %d saying %q\n%s", tt.args, code, tt.code, tt.want, out)
		}
	}
}

// TestGroupUnhalt: a partition of a running consumer halts on a unit whose
// handler fails permanently (onPermanentFailure: halt); its log names the
// command that unhalts it. Once the cause is fixed, `group unhalt g
// --partition P` removes the halt and says where it was, and the unit is
// handled within a second of the command's return (the poll is an hour
// away). Unhalting it again succeeds and says it was not halted; both are
// in the audit, with the partition. Without --partition, or with a bad
// one, the command exits 2.
func TestGroupUnhalt(t *testing.T) {
	t.Parallel()
	url, pool := migrated(t, 2)
	eventtest.Exec(t, pool, `CREATE TABLE public.poison (host_id text)`)
	// The recording handler, failing with a division by zero (a data error:
	// permanent) on the hosts in poison.
	statement := `INSERT INTO handled (c_offset, host_id, partition_id, transaction_id)
SELECT @c_offset, @host_id, @partition_id, @transaction_id
WHERE 1 / (1 - (SELECT count(*) FROM public.poison WHERE host_id = @host_id))::int = 1`
	c := recordingConfig(2, -1, 10)
	c = strings.Replace(c, strings.Join(strings.Fields(eventtest.RecordSQL), " "), strings.Join(strings.Fields(statement), " "), 1)
	c = strings.Replace(c, "waitPeriodMs: 1000", "waitPeriodMs: 3600000\nonPermanentFailure: halt", 1)
	cfg := writeConfig(t, c)
	p := start(t, url, "run", "--config", cfg)
	pgtest.WaitFor(t, 20*time.Second, "both partitions leased", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_leases WHERE group_id = 'g' AND owner <> ''`) == 2
	})
	eventtest.Exec(t, pool, `INSERT INTO public.poison VALUES ('x')`)
	appendEvents := func(host string) {
		t.Helper()
		ctx := context.Background()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := pgevents.Append(ctx, tx, pgevents.Event{HostID: host, EventType: "t", Payload: []byte(`{}`)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	appendEvents("x")
	pgtest.WaitFor(t, 20*time.Second, "the partition halted", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_halts`) == 1
	})
	part := eventtest.QueryInt(t, pool, `SELECT partition_id FROM partition_halts`)
	offset := eventtest.QueryInt(t, pool, `SELECT c_offset FROM partition_halts`)
	hint := fmt.Sprintf("consumer group unhalt g --partition %d --topic 1", part)
	pgtest.WaitFor(t, 10*time.Second, "the halt logged with the command that unhalts it", func() bool {
		return strings.Contains(p.out.String(), hint)
	})

	eventtest.Exec(t, pool, `DELETE FROM public.poison`)
	code, out := runOnce(t, url, "group", "unhalt", "g", "--partition", fmt.Sprint(part), "--config", cfg)
	returned := time.Now()
	want := fmt.Sprintf("group g on topic 1: partition %d unhalted; it was halted at offset %d: ", part, offset)
	if code != 0 || !strings.Contains(out, want) {
		t.Fatalf("group unhalt: exit %d, want 0 saying %q\n%s", code, want, out)
	}
	pgtest.WaitFor(t, time.Second, "the unit handled within a second of the unhalt", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM handled`) == 1
	})
	t.Logf("the unit was handled %s after group unhalt returned", time.Since(returned).Round(time.Millisecond))
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_halts`); n != 0 {
		t.Fatalf("%d halts left after the unhalt", n)
	}
	code, out = runOnce(t, url, "group", "unhalt", "g", "--partition", fmt.Sprint(part), "--config", cfg)
	if want := fmt.Sprintf("partition %d of group g on topic 1 was not halted: nothing changed", part); code != 0 || !strings.Contains(out, want) {
		t.Fatalf("group unhalt of a partition not halted: exit %d, want 0 saying %q\n%s", code, want, out)
	}
	for _, args := range [][]string{{"group", "unhalt", "g"}, {"group", "unhalt", "g", "--partition", "-1"}, {"group", "unhalt", "g", "--partition", "x"}} {
		if code, out := runOnce(t, url, append(args, "--config", cfg)...); code != 2 {
			t.Errorf("%v: exit %d, want 2\n%s", args, code, out)
		}
	}
	actor := cliActor()
	got := auditRows(t, pool)
	wantRows := []string{
		fmt.Sprintf("cli %s unhalt halted at offset %d: ", actor, offset),
		"cli " + actor + " unhalt not halted | ok",
	}
	if len(got) != len(wantRows) {
		t.Fatalf("audit rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantRows, "\n"))
	}
	for i := range wantRows {
		if !strings.HasPrefix(got[i], wantRows[i]) || !strings.HasSuffix(got[i], "| ok") {
			t.Errorf("audit row %d: %q, want %q… | ok", i, got[i], wantRows[i])
		}
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM console_audit WHERE action = 'unhalt' AND partition_id = $1 AND group_id = 'g' AND topic_id = 1`, part); n != 2 {
		t.Errorf("%d unhalt audit rows name the group, topic and partition, want 2", n)
	}
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}

// TestResetPastAHalt: `offsets reset` clears the halt of a partition whose
// position it moves past (the unit is skipped), keeps the halt of one it
// does not move past, and says which, in the table, the JSON and the
// audit.
func TestResetPastAHalt(t *testing.T) {
	t.Parallel()
	url, pool := migrated(t, 4)
	cfg := writeConfig(t, recordingConfig(4, -1, 10))
	ctx := context.Background()
	if _, err := offsets.Subscribe(ctx, pool, "g", 1, offsets.Start{Kind: offsets.Earliest}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := store.Init(ctx, pool, "g", 1, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		if _, err := pgevents.Append(ctx, pool, pgevents.Event{HostID: fmt.Sprintf("host-%d", i), EventType: "t", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Halt(ctx, pool, "g", 1, 0, 1, "behind the reset"); err != nil {
		t.Fatal(err)
	}
	if err := store.Halt(ctx, pool, "g", 1, 3, 1_000_000_000, "ahead of the reset"); err != nil {
		t.Fatal(err)
	}
	code, out := runOnce(t, url, "offsets", "reset", "--group", "g", "--to", "latest", "--config", cfg)
	if code != 0 || !strings.Contains(out, "(halt at 1 cleared: moved past it)") ||
		!strings.Contains(out, "(still halted at 1000000000: unhalt it to try that unit again)") {
		t.Fatalf("offsets reset: exit %d, want 0 saying which halt it cleared and which it kept\n%s", code, out)
	}
	halts := eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_halts WHERE group_id = 'g' AND partition_id = 0`)
	kept := eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_halts WHERE group_id = 'g' AND partition_id = 3`)
	if halts != 0 || kept != 1 {
		t.Fatalf("after the reset: %d halts in partition 0 (want 0, moved past), %d in partition 3 (want 1, ahead)", halts, kept)
	}
	if got := auditRows(t, pool); len(got) != 1 || !strings.Contains(got[0], "(halt at 1 cleared: moved past it)") {
		t.Errorf("audit: %q, want the reset with the halt it cleared", got)
	}
	// --json: the same, as fields.
	if err := store.Halt(ctx, pool, "g", 1, 1, 1, "behind the reset"); err != nil {
		t.Fatal(err)
	}
	code, out = runOnce(t, url, "offsets", "reset", "--group", "g", "--to", "latest", "--json", "--config", cfg)
	var moves []offsets.Move
	if err := json.Unmarshal([]byte(out), &moves); code != 0 || err != nil || len(moves) != 4 {
		t.Fatalf("offsets reset --json: exit %d, %v\n%s", code, err, out)
	}
	if m := moves[1]; m.Unhalted == nil || *m.Unhalted != 1 || m.Halted != nil {
		t.Errorf("partition 1: %s, want unhalted 1", out)
	}
	if m := moves[3]; m.Halted == nil || *m.Halted != 1_000_000_000 || m.Unhalted != nil {
		t.Errorf("partition 3: %s, want halted 1000000000", out)
	}
	if m := moves[0]; m.Halted != nil || m.Unhalted != nil {
		t.Errorf("partition 0: %s, want no halt", out)
	}
}
