package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/pgeventstype"
	"github.com/pgevents/pgevents/schema"
)

// Event is one event of the log (pgeventstype.Event).
type Event = pgeventstype.Event

// Statements. Every statement that reads events names topic_id and
// partition_id and a lower bound on c_offset, so it is answered from
// outbox_message_t_partition_idx and touches only this partition's rows.
const (
	// nextOffsetsSQL reads the next offset of every partition the topic has
	// had, element p+1 for partition p: the offset the next append to it
	// will get, never more than an offset an append in flight holds
	// (partition_next_offset). Read it in a statement of its own, before the
	// statement that looks for the first retained events: then every event
	// below it that is committed is visible to that later statement. Read in
	// one statement, the events would be looked for in the statement's
	// snapshot, taken before the next offset was read (and, for a sequence
	// topic, before the append in flight it waited for committed), and that
	// append's events would be skipped.
	nextOffsetsSQL = `SELECT array_agg({schema}partition_next_offset($1, pc.partition_id) ORDER BY pc.partition_id)
FROM {schema}partition_counters pc WHERE pc.topic_id = $1`

	eventColumns = `m.c_offset, m.topic_id, m.partition_id, m.event_id, m.host_id, m.user_id,
       m.transaction_id, m.event_type, m.payload, m.metadata, m.created_at`

	// pendingCut and claimCut are layout_cut(topic, version,
	// partition) (migration 0008) written out in the statements that use
	// them, or the largest offset when no layout follows: the partition's
	// first offset in layout version + 1. The statements a worker runs for
	// every batch or idle period use them instead of the function, which
	// PostgreSQL cannot inline (its body has a subquery) and so parses and
	// plans again at every execution of the statement that calls it
	// (measured: a large share of the claim's server time).
	pendingCut = cutHead + `u.p` + cutMid + `$2 AND l.version = $4` + cutTail
	claimCut   = cutHead + `$3` + cutMid + `$2 AND l.version = $5` + cutTail
	cutHead    = `coalesce((SELECT CASE WHEN l.from_offsets IS NULL THEN l.from_offset ELSE coalesce(l.from_offsets[`
	cutMid     = ` + 1], 1) END
             FROM {schema}topic_layouts l WHERE l.topic_id = `
	cutTail = ` + 1), 9223372036854775807)`

	// awaitAppendSQL waits, at most $3 milliseconds, for the appends in
	// flight on a partition: it takes the partition's flight key exclusive,
	// which each of them holds shared from its start to its commit (SQL
	// mark_flight), and releases it at once (SQL await_flight). Appends
	// never wait for the key (they only try it: one that starts meanwhile
	// goes unmarked), nor notify because of it. When the bound runs out it
	// names a producer's session that holds the key, and the claim goes on
	// with what is committed: a producer that keeps its transaction open
	// costs the claim its bound, never its connection.
	awaitAppendSQL = `SELECT {schema}await_flight($1, $2, $3)`

	// fetchSQL reads the events after offset $3 in the partition: the
	// continuation of a producer transaction larger than the batch, read in
	// chunks under the claim's lock. %[1]s is the partition's table.
	fetchSQL = `SELECT ` + eventColumns + `
FROM {schema}%[1]s m
WHERE m.topic_id = $1 AND m.partition_id = $2 AND m.c_offset > $3 AND m.c_offset < $5
ORDER BY m.c_offset
LIMIT $4`
)

// The claim's statements.
const (
	// positionExpr is the group's position in the partition: the newest row
	// of consumer_positions, read from the index's end whatever older rows
	// an open snapshot keeps.
	positionExpr = `(SELECT o.next_offset FROM {schema}consumer_positions o
    WHERE o.group_id = $1 AND o.topic_id = $2 AND o.partition_id = $3 ORDER BY o.seq DESC LIMIT 1)`

	// claimSQL opens a batch in one statement: claim_state (migration 0021)
	// takes the group's position lock of the partition and the owner's
	// batch key ($6) for the rest of the transaction, and reads, in a
	// snapshot taken after them, whether the replica still owns the lease
	// with epoch $7, whether the group is PAUSED, and the position; the
	// statement then reads up to $4 events from that position, in its own
	// snapshot (the migration has the argument). Each row carries the
	// state and one event; a claim that finds no event (or no lease, or a
	// pause) returns one row whose event columns are NULL.
	//
	// Events stop at the end of the partition in the claimer's layout $5:
	// its first offset in the next layout, read in the same snapshot as the
	// events. A repartition records the next layout under the topic's
	// append locks, so an event past the cut is never visible to a claim
	// that does not see the cut.
	//
	// %[1]s is the partition's table (PartitionTable): the statement's plan
	// touches only that partition's tables, so a batch locks nothing of
	// other partitions (retention drops their segments meanwhile), and no
	// routing through the log's partitions is paid. The position is an
	// InitPlan's value: the executor runs claim_state (the CTE) before it
	// reads an event, whatever the join order.
	//
	// Plans: the statement runs on its generic plan, which reads the
	// batch's rows through the index in c_offset order under the LIMIT
	// whatever the statistics said when it was made (an empty table's
	// included), and is planned once per connection. A custom plan, which
	// the server would choose at every execution (its LIMIT is known, so it
	// looks cheaper), is planned anew each time: a millisecond with a
	// partition's segments. So a session is readied once, before its first
	// batch (ReadySession: plan_cache_mode = force_generic_plan for the
	// session), and the claim sets the mode back to auto for the rest of
	// its transaction: the handlers' statements are planned as in any
	// session.
	claimSQL = `WITH s AS MATERIALIZED (
    SELECT c.held, c.paused, c.next_offset, set_config('plan_cache_mode', 'auto', true)
    FROM {schema}claim_state($1, $2, $3, $6, $7) c
)
SELECT s.held, s.paused, s.next_offset, ` + claimEventColumns + `
FROM s LEFT JOIN (
    SELECT ` + eventColumns + `
    FROM {schema}%[1]s m
    WHERE m.topic_id = $2 AND m.partition_id = $3 AND m.c_offset >= (SELECT s.next_offset FROM s)
      AND m.c_offset < ` + claimCut + `
      AND (SELECT s.held AND NOT s.paused FROM s)
    ORDER BY m.c_offset
    LIMIT $4
) e ON true`

	claimEventColumns = `e.c_offset, e.topic_id, e.partition_id, e.event_id, e.host_id, e.user_id,
       e.transaction_id, e.event_type, e.payload, e.metadata, e.created_at`

	// genericPlansExpr switches the transaction to generic plans
	// (plan_cache_mode = force_generic_plan, local to the transaction),
	// for Pending's statement, which compares c_offset with the group's
	// position read in the same statement: a custom plan, which PostgreSQL
	// chooses for the first five executions of a prepared statement and
	// then whenever it looks cheaper, plans it over every segment of every
	// partition at every poll. The generic plan is planned once per
	// connection.
	genericPlansExpr = `set_config('plan_cache_mode', 'force_generic_plan', true)`

	// genericPlansSQL switches the transaction to generic plans (see
	// genericPlansExpr), for statements run in an implicit transaction
	// (a pipeline without BEGIN), whose end restores the setting.
	genericPlansSQL = `SELECT ` + genericPlansExpr
)

// LeaseLostCode is the SQLSTATE commit_position raises when the batch's
// replica no longer owns the partition's lease with the batch's epoch.
const LeaseLostCode = "PGL01"

// PartitionTable returns the name of the table that holds a partition of a
// topic (see migration 0008): every statement that reads one partition's
// events in a batch transaction names it, so that it locks and plans only
// that partition's tables.
func PartitionTable(topic, partition int) string {
	return "outbox_message_t_" + strconv.Itoa(topic) + "_p" + strconv.Itoa(partition)
}

// PartitionSQL holds the statements of one partition, with its table's
// name in them; make them once per partition with ForPartition.
type PartitionSQL struct {
	claim, fetch, deadLetter, park string
}

// ForPartition returns the statements of a partition of topic.
func ForPartition(topic, partition int) *PartitionSQL {
	t := PartitionTable(topic, partition)
	return &PartitionSQL{
		claim:      fmt.Sprintf(claimSQL, t),
		fetch:      fmt.Sprintf(fetchSQL, t),
		deadLetter: fmt.Sprintf(writeDeadLetterSQL, t),
		park:       fmt.Sprintf(parkEventsSQL, t),
	}
}

// readySQL readies a session for batches (ReadySession): pgevents'
// statements on it run on their generic plans (claimSQL says why).
const readySQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', false)`

// readyKey marks, in a connection's CustomData, a session ReadySession
// readied.
const readyKey = "pgevents.ready"

// ReadySession readies conn's session for batches, once per session (the
// connection remembers it): plan_cache_mode = force_generic_plan for the
// session, outside any transaction, so that the claim runs on its generic
// plan (see claimSQL); the claim gives its transaction's handlers auto
// back. Call it on an idle connection before its first batch.
func ReadySession(ctx context.Context, conn *pgx.Conn) error {
	cd := conn.PgConn().CustomData()
	if cd[readyKey] != nil {
		return nil
	}
	if _, err := conn.Exec(ctx, readySQL); err != nil {
		return fmt.Errorf("ready the session: %w", err)
	}
	cd[readyKey] = true
	return nil
}

// Claim describes a claim of a partition's next batch.
type Claim struct {
	Group     string
	Topic     int
	Partition int
	// Limit is the number of events to read.
	Limit int
	// Layout is the version of the layout the claimer consumes: events
	// from the next layout's first offset on belong to that layout's
	// partitions and are not read.
	Layout int
	// Parked asks for the partition's parked hosts too.
	Parked bool
	// Owner and Epoch are the lease the claim is made under.
	Owner string
	Epoch int64
	// AwaitAppend makes the claim wait, first, for the append in flight on
	// the partition to commit (awaitAppendSQL), so that a consumer that saw
	// one coming reads its events as soon as they commit, in the same
	// round trip.
	AwaitAppend bool
	// AwaitMax bounds that wait; 0 or more than AwaitAppendMax:
	// AwaitAppendMax. A consumer whose sessions have a short
	// statement_timeout waits less, so that the wait never ends the claim.
	AwaitMax time.Duration
	// SQL holds the partition's statements (ForPartition).
	SQL *PartitionSQL
}

// Claimed is what a claim returns.
type Claimed struct {
	// Tx is the batch transaction, holding the partition's lock; the caller
	// must end it.
	Tx pgx.Tx
	// Events are the events read, in offset order, appended to the buffer
	// given to Do.
	Events []Event
	// Parked maps the partition's parked hosts to the dead letter they wait
	// behind, when Claim.Parked was set; it is read under the lock.
	Parked map[string]int64
	// Next is the group's position in the partition, read under the lock,
	// when the claim found no event (0 otherwise): the worker's position
	// comes from the database, never from what a notification said.
	Next int64
	// InFlight names a producer's session whose append was still in
	// flight on the partition when the claim's wait for it ran out
	// (AwaitAppendMax); nil when the claim did not wait or the append
	// committed.
	InFlight *string
}

// AwaitAppendMax bounds a claim's wait for an append in flight
// (Claim.AwaitAppend), below any statement_timeout a consumer's session
// is likely to have.
const AwaitAppendMax = time.Second

// applicationName returns name as the server keeps an application_name:
// printable ASCII (other bytes become '?'), at most 63 bytes.
func applicationName(name string) string {
	b := []byte(name)
	for i, c := range b {
		if c < 32 || c > 126 {
			b[i] = '?'
		}
	}
	return string(b[:min(len(b), 63)])
}

// ErrLeaseLost is returned by Claim and Commit when the replica no longer
// owns the partition's lease with the epoch it claimed under. Its text
// starts with "pgevents: ", unlike this package's other errors: the root
// package exports it as pgevents.ErrLeaseLost and hands it to handlers
// bare, as their context's cause.
var ErrLeaseLost = errors.New("pgevents: partition lease lost")

// ErrPaused is returned by Claim when the group's subscription is PAUSED:
// the claim rolled back, and nothing may be handled until a resume.
var ErrPaused = errors.New("the group is paused")

// Do begins a transaction on db, locks the group's position in the
// partition for the rest of it, and appends to buf up to c.Limit events
// from that position, in offset order: BEGIN and the claim statement
// (claimSQL: the lock, the lease's and the pause's checks, the position
// and the events) travel in one round trip, with the partition's parked
// hosts after the claim when c.Parked is set, and the wait for an append
// in flight before it when c.AwaitAppend is.
func (c Claim) Do(ctx context.Context, db schema.DB, buf []Event) (Claimed, error) {
	var b pgx.Batch
	b.BeginTx(ReadCommitted)
	if c.AwaitAppend {
		wait := AwaitAppendMax
		if c.AwaitMax > 0 && c.AwaitMax < wait {
			wait = c.AwaitMax
		}
		b.Queue(schema.SQL(ctx, awaitAppendSQL), c.Topic, c.Partition, wait.Milliseconds())
	}
	b.Queue(schema.SQL(ctx, c.SQL.claim), c.Group, c.Topic, c.Partition, c.Limit, c.Layout, c.Owner, c.Epoch)
	if c.Parked {
		b.Queue(schema.SQL(ctx, parkedSQL), c.Group, c.Topic, c.Partition)
	}
	br := db.SendBatch(ctx, &b)
	out := Claimed{Tx: br.Tx(), Events: buf}
	fail := func(err error) (Claimed, error) {
		_ = br.Close()
		if c.AwaitAppend {
			// The append lock the wait takes is the session's: a pipeline
			// that failed between taking and releasing it would leave it
			// held, and the partition's appends waiting. The session goes.
			_ = out.Tx.Conn().Close(context.WithoutCancel(ctx))
		}
		_ = out.Tx.Rollback(context.WithoutCancel(ctx))
		return Claimed{Events: out.Events[:len(buf)]}, fmt.Errorf("claim: %w", err)
	}
	if _, err := br.Exec(); err != nil { // BEGIN
		return fail(err)
	}
	if c.AwaitAppend {
		if err := br.QueryRow().Scan(&out.InFlight); err != nil {
			return fail(err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return fail(err)
	}
	var st claimState
	if st, out.Events, err = scanClaim(rows, buf); err != nil {
		return fail(err)
	}
	if c.Parked {
		rows, err := br.Query()
		if err != nil {
			return fail(err)
		}
		out.Parked = map[string]int64{}
		for rows.Next() {
			var host string
			var id int64
			if err := rows.Scan(&host, &id); err != nil {
				rows.Close()
				return fail(err)
			}
			out.Parked[host] = id
		}
		if err := rows.Err(); err != nil {
			return fail(err)
		}
	}
	if err := br.Close(); err != nil {
		return fail(err)
	}
	if !st.held {
		_ = out.Tx.Rollback(context.WithoutCancel(ctx))
		return Claimed{Events: out.Events[:len(buf)]}, ErrLeaseLost
	}
	if st.paused {
		_ = out.Tx.Rollback(context.WithoutCancel(ctx))
		return Claimed{Events: out.Events[:len(buf)]}, ErrPaused
	}
	if len(out.Events) == len(buf) {
		// Nothing at or after the position: say where the position is.
		if st.next == nil {
			return fail(fmt.Errorf("group %q has no position in partition %d: %w", c.Group, c.Partition, ErrNoPosition))
		}
		out.Next = *st.next
	}
	return out, nil
}

// Fetch appends to buf up to limit events of the partition after offset
// after and below offset below, in offset order. It takes no lock: call it
// in the transaction that claimed the partition.
func Fetch(ctx context.Context, q schema.DB, ps *PartitionSQL, topic, partition int, after, below int64, limit int, buf []Event) ([]Event, error) {
	rows, err := q.Query(ctx, schema.SQL(ctx, ps.fetch), topic, partition, after, limit, below)
	if err != nil {
		return buf, fmt.Errorf("fetch: %w", err)
	}
	return scanEvents(rows, buf, "fetch")
}
