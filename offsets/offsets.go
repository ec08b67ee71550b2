package offsets

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

// The kinds of Start, as pgevents.ParseStartPosition names them.
const (
	// Earliest is the first event the log still retains.
	Earliest = "earliest"
	// Latest is the end of the log: events appended from now on.
	Latest = "latest"
	// AtOffset is Start.Offset, in every partition.
	AtOffset = "offset"
	// AtTime is the first event appended at or after Start.Time.
	AtTime = "time"
)

// Start is a position to reset a group to (pgevents.ParseStartPosition
// reads the CLI's form of it).
type Start struct {
	// Kind is Earliest, Latest, AtOffset or AtTime.
	Kind string
	// Offset is the first offset to read, for Kind AtOffset.
	Offset int64
	// Time is the time to start from, for Kind AtTime.
	Time time.Time
}

// String returns s as pgevents.ParseStartPosition reads it: "earliest",
// "latest", "offset:N" or "time:<RFC 3339>".
func (s Start) String() string {
	switch s.Kind {
	case AtOffset:
		return "offset:" + strconv.FormatInt(s.Offset, 10)
	case AtTime:
		return "time:" + s.Time.Format(time.RFC3339Nano)
	}
	return s.Kind
}

func (s Start) store() store.Start { return store.Start{Kind: s.Kind, Offset: s.Offset, Time: s.Time} }

// Move is what a reset did, or would do, to one partition's position.
type Move struct {
	// Partition is the partition.
	Partition int `json:"partition_id"`
	// From is the position before the reset; -1 when the group had none.
	From int64 `json:"from"`
	// To is the position after the reset.
	To int64 `json:"to"`
	// Unhalted is the offset of the partition's halt that the reset moved
	// past (To beyond it), and removed: the unit the partition stopped
	// before is skipped, and the partition goes on from To. Nil when the
	// reset removed no halt.
	Unhalted *int64 `json:"unhalted,omitempty"`
	// Halted is the offset of the partition's halt that the reset did not
	// move past (To at or before it), and kept: the partition stays halted
	// until it is unhalted (or its consumer restarts). Nil when the
	// partition is not halted.
	Halted *int64 `json:"halted,omitempty"`
}

// ErrGroupRunning is returned by Reset and Preview, wrapped, when a replica
// of the group is live and force is not set.
var ErrGroupRunning = store.ErrGroupRunning

// Reset moves every position of the group on topic to start, in one
// transaction, and returns what moved, by partition. It waits for the
// group's batches in flight. A halted partition whose position moves past
// its halt is unhalted (Move.Unhalted): the unit it stopped before is
// skipped. One whose position moves to its halt or before stays halted
// (Move.Halted). The group's consumers are told at the commit. It returns ErrGroupRunning while a replica of
// the group is live, unless force is set: the live replicas then lose their
// leases (their batch in flight cannot commit) and continue from the new
// positions.
func Reset(ctx context.Context, db schema.DB, group string, topic int, start Start, force bool) ([]Move, error) {
	moves, err := store.Reset(ctx, db, group, topic, start.store(), force)
	if err != nil {
		return nil, err
	}
	out := make([]Move, len(moves))
	for i, m := range moves {
		out[i] = Move(m)
	}
	return out, nil
}

// Counted is a Move with the events it replays or skips.
type Counted struct {
	Move
	// Replay counts the events the group handles again (the position moves
	// back), up to CountCap.
	Replay int64
	// Skip counts the events the group never handles (the position moves
	// forward), up to CountCap.
	Skip int64
}

// CountCap bounds the events Count counts per partition.
const CountCap = 10_000_000

// Count counts, for each move, the events of topic between its From and
// its To: replayed when the position moved back, skipped when it moved
// forward (neither when the group had no position). Call it in the
// transaction that ran Reset, to show what the reset does before
// committing it, or with moves read at any time. It counts up to CountCap
// events per partition (see CountUpTo).
func Count(ctx context.Context, db schema.DB, topic int, moves []Move) ([]Counted, error) {
	return CountUpTo(ctx, db, topic, moves, CountCap)
}

// CountUpTo is Count with its own bound: it counts up to limit events per
// partition, so a caller that only needs to know whether a move is small
// (the console's reset preview) reads at most limit index entries of each
// partition whatever the log's size. A count of limit means "limit or
// more".
func CountUpTo(ctx context.Context, db schema.DB, topic int, moves []Move, limit int64) ([]Counted, error) {
	out := make([]Counted, 0, len(moves))
	var parts []int32
	var from, to []int64
	for _, m := range moves {
		out = append(out, Counted{Move: m})
		switch {
		case m.From < 0 || m.From == m.To:
		case m.To < m.From:
			parts, from, to = append(parts, int32(m.Partition)), append(from, m.To), append(to, m.From)
		default:
			parts, from, to = append(parts, int32(m.Partition)), append(from, m.From), append(to, m.To)
		}
	}
	if len(parts) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, schema.SQL(ctx, countRangesSQL), topic, parts, from, to, limit)
	if err != nil {
		return nil, fmt.Errorf("count events: %w", err)
	}
	counts := map[int32]int64{}
	var (
		p int32
		n int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&p, &n}, func() error { counts[p] += n; return nil }); err != nil {
		return nil, fmt.Errorf("count events: %w", err)
	}
	for i := range out {
		c := &out[i]
		n := counts[int32(c.Partition)]
		if c.From >= 0 && c.To < c.From {
			c.Replay = n
		} else if c.From >= 0 && c.To > c.From {
			c.Skip = n
		}
	}
	return out, nil
}

// Preview returns what Reset with the same arguments would do, with the
// events each partition would replay or skip, and changes nothing: it runs
// the reset in a transaction that it rolls back.
func Preview(ctx context.Context, db schema.DB, group string, topic int, start Start, force bool) ([]Counted, error) {
	tx, err := store.Begin(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("preview: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the preview is rolled back
	moves, err := Reset(ctx, tx, group, topic, start, force)
	if err != nil {
		return nil, err
	}
	return Count(ctx, tx, topic, moves)
}

// DefaultLagCap is the cap on the events Positions counts per partition.
const DefaultLagCap = 100000

// Position is a group's position in one partition.
type Position struct {
	// Partition is the partition.
	Partition int
	// Next is the next offset the group reads; -1 when the group has no
	// position in the partition (no replica of it ever served it).
	Next int64
	// LogEnd is the highest offset of the partition; 0 when it holds no
	// event.
	LogEnd int64
	// Lag counts the partition's events at or after Next (for a sequenced
	// topic, with the events staged for the partition that no tick has
	// moved into the log yet), up to the cap given to Positions; 0 without
	// a position.
	Lag int64
	// LagCapped says that counting stopped at the cap: the lag is at least
	// Lag.
	LagCapped bool
	// LagTime is the database clock minus the append time of the first
	// event at or after Next (or of the oldest staged one, when older); 0
	// when there is none.
	LagTime time.Duration
}

// Positions returns the group's position in each partition of its layout
// on topic, in partition order, with the partition's log end and the
// group's lag, counting at most lagCap events per partition (DefaultLagCap
// when lagCap is not positive). It takes no lock. It returns no position
// when the topic does not exist.
func Positions(ctx context.Context, db schema.DB, group string, topic int, lagCap int64) ([]Position, error) {
	if lagCap <= 0 {
		lagCap = DefaultLagCap
	}
	rows, err := store.QueryWithoutJIT(ctx, db, schema.SQL(ctx, positionsSQL), group, topic, lagCap)
	if err != nil {
		return nil, fmt.Errorf("positions: %w", err)
	}
	var (
		out          []Position
		p            int32
		next, logEnd *int64
		lag          int64
		secs         float64
	)
	if _, err := pgx.ForEachRow(rows, []any{&p, &next, &logEnd, &lag, &secs}, func() error {
		pos := Position{Partition: int(p), Next: -1, Lag: lag, LagCapped: lag >= lagCap,
			LagTime: time.Duration(secs * float64(time.Second))}
		if next != nil {
			pos.Next = *next
		} else {
			pos.Lag, pos.LagCapped = 0, false
		}
		if logEnd != nil {
			pos.LogEnd = *logEnd
		}
		out = append(out, pos)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("positions: %w", err)
	}
	return out, nil
}

// Lag returns the group's lag on topic in events, summed over its
// partitions, counting at most lagCap events per partition (DefaultLagCap
// when lagCap is not positive); capped says that a partition's count
// stopped at the cap, so the lag is at least the sum.
func Lag(ctx context.Context, db schema.DB, group string, topic int, lagCap int64) (events int64, capped bool, err error) {
	ps, err := Positions(ctx, db, group, topic, lagCap)
	if err != nil {
		return 0, false, err
	}
	for _, p := range ps {
		events += p.Lag
		capped = capped || p.LagCapped
	}
	return events, capped, nil
}

// Subscription states (see migration 0005 for the lifecycle).
const (
	// Active means that the group's replicas consume.
	Active = store.StateActive
	// Paused means that the group's replicas run but handle nothing until it
	// is resumed.
	Paused = store.StatePaused
	// Dead means that no replica was seen for the group's dead_after; the
	// next one to start makes the group Active again.
	Dead = store.StateDead
	// Cancelled is terminal: the group's replicas stop, and the group no
	// longer holds retention back.
	Cancelled = store.StateCancelled
)

// ErrTransition is returned, wrapped, for a transition the lifecycle does
// not allow (resuming a group that is Dead, leaving Cancelled).
var ErrTransition = store.ErrTransition

// ErrCancelled is returned, wrapped, where a group's subscription is
// Cancelled and the operation needs a live one.
var ErrCancelled = store.ErrCancelled

// SetState moves the group's subscription on topic to Paused, to Active
// (from Paused) or to Cancelled, and returns the state it had before. A
// move to the state the group is in already does nothing and succeeds
// (pausing a paused group, resuming an active one): the state returned is
// then to, which says so. Any other transition returns ErrTransition.
func SetState(ctx context.Context, db schema.DB, group string, topic int, to string) (string, error) {
	return store.SetState(ctx, db, group, topic, to)
}

// Pause is SetState(ctx, db, group, topic, Paused).
func Pause(ctx context.Context, db schema.DB, group string, topic int) (string, error) {
	return SetState(ctx, db, group, topic, Paused)
}

// Resume is SetState(ctx, db, group, topic, Active).
func Resume(ctx context.Context, db schema.DB, group string, topic int) (string, error) {
	return SetState(ctx, db, group, topic, Active)
}

// Cancel is SetState(ctx, db, group, topic, Cancelled).
func Cancel(ctx context.Context, db schema.DB, group string, topic int) (string, error) {
	return SetState(ctx, db, group, topic, Cancelled)
}

// State returns the group's subscription state on topic, or "" when the
// group has no subscription there.
func State(ctx context.Context, db schema.DB, group string, topic int) (string, error) {
	return store.SubscriptionState(ctx, db, group, topic)
}

// Halt says where and why a partition of a group halted.
type Halt struct {
	// Partition is the halted partition.
	Partition int
	// Offset is the offset the partition stopped at: the first of the unit
	// that failed.
	Offset int64
	// Reason is the failure.
	Reason string
}

// Halts returns the group's halted partitions on topic.
func Halts(ctx context.Context, db schema.DB, group string, topic int) ([]Halt, error) {
	hs, err := store.Halts(ctx, db, group, topic)
	if err != nil {
		return nil, err
	}
	out := make([]Halt, len(hs))
	for i, h := range hs {
		out[i] = Halt(h)
	}
	return out, nil
}

// Unhalt removes the partition's halt record and returns it; ok is false
// when the partition was not halted (nothing changed). The group's
// consumers are told when db's transaction commits: the partition's worker
// tries the unit again from the group's position within milliseconds.
func Unhalt(ctx context.Context, db schema.DB, group string, topic, partition int) (h Halt, ok bool, err error) {
	r, err := store.Unhalt(ctx, db, group, topic, partition)
	if err != nil || r == nil {
		return Halt{}, false, err
	}
	return Halt(*r), true, nil
}

// TxOptions returns the options an operator's transaction on positions,
// subscriptions and halts must begin with: READ COMMITTED, whatever the
// session's default, so that what it reads after a lock is what the
// lock's previous holder committed (see the consumer's pool settings,
// pgevents.NewPoolConfig). Begin such transactions with
// pool.BeginTx(ctx, offsets.TxOptions()). It is a function so that no
// caller can change the options another caller begins with.
func TxOptions() pgx.TxOptions { return store.ReadCommitted }

// ReadCommitted is TxOptions().
//
// Deprecated: use TxOptions. A variable could be assigned by any caller
// (to no effect on pgevents, which never read this copy). Kept for one
// release; see CHANGELOG.md.
var ReadCommitted = TxOptions()

// Watcher says which consumer watches a topic for the others.
type Watcher struct {
	// Session is the application_name of the elected watcher's session,
	// "pgevents watcher <replica>": the consumer whose watcher reads the
	// topic's tails and tells the other consumers of the database which
	// partitions moved. Empty when none is elected (no consumer runs).
	Session string
	// Waiting counts the other consumers' watchers, which wait to take
	// over when that session ends.
	Waiting int
}

// Watchers returns the topic's elected watcher and how many wait for its
// key.
func Watchers(ctx context.Context, db schema.DB, topic int) (Watcher, error) {
	s, n, err := store.RoleSessions(ctx, db, store.RoleWatcher, topic)
	return Watcher{Session: s, Waiting: n}, err
}

// Subscribe registers group on topic, starting at start, unless it is
// registered already; it marks the group live either way (a DEAD group
// becomes ACTIVE), and returns its state. deadAfter is how long the group
// may go without a sign of life before it is DEAD (it no longer holds
// retention back); a live process renews it with Subscribe or Commit. A
// CANCELLED group stays cancelled. A consumer subscribes itself; this is
// for a reader that commits positions its own way (the Kafka endpoint's
// groups).
func Subscribe(ctx context.Context, db schema.DB, group string, topic int, start Start, deadAfter time.Duration) (string, error) {
	state, _, err := store.Subscribe(ctx, db, group, topic, start.store(), deadAfter)
	return state, err
}

// KeepLive marks group's subscription on topic live, as a replica's
// heartbeat does (a DEAD group becomes ACTIVE), without changing its
// settings, and returns its state; it fails when the group has no
// subscription there. It is for a reader that commits positions its own
// way and keeps the group live by committing (a Kafka client that assigns
// itself partitions).
func KeepLive(ctx context.Context, db schema.DB, group string, topic int) (string, error) {
	return store.Heartbeat(ctx, db, group, topic)
}

// Commit sets group's next offset on topic in the partitions of next
// (partition to offset), in one transaction, as a worker's batch commits a
// position: each partition's position lock is taken (in ascending order),
// so a commit waits for a batch of the group in flight and never runs
// beside one. A negative offset removes the partition's position (the
// group has none there, as a Kafka group that committed -1 has no
// committed offset: a reader starts it where its own reset policy says;
// a pgevents replica, from the partition's first offset), and offset 0 is
// stored as 1, the first offset a partition can have. The group must be
// subscribed (Subscribe). It is how a Kafka client's OffsetCommit moves a
// group: it returns a *GroupInUseError, and changes nothing, while a
// pgevents replica of the group is live (a group's name belongs to one
// kind of consumer at a time; see HoldGroup).
func Commit(ctx context.Context, db schema.DB, group string, topic int, next map[int]int64) error {
	if len(next) == 0 {
		return nil
	}
	ps := make([]int32, 0, len(next))
	for p := range next {
		ps = append(ps, int32(p))
	}
	slices.Sort(ps)
	var (
		set     []int32
		ns      []int64
		removed []int32
	)
	for _, p := range ps {
		switch n := next[int(p)]; {
		case n < 0:
			removed = append(removed, p)
		default:
			set, ns = append(set, p), append(ns, max(n, 1))
		}
	}
	tx, err := store.Begin(ctx, db)
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if err := store.HoldGroup(ctx, tx, group, false, "", ""); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, lockPositionsSQL), group, topic, ps); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if len(removed) > 0 {
		if _, err := tx.Exec(ctx, schema.SQL(ctx, removePositionsSQL), group, topic, removed); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
	}
	if len(set) > 0 {
		if _, err := tx.Exec(ctx, schema.SQL(ctx, commitPositionsSQL), group, topic, set, ns); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// GroupInUseError says that a group's name is in use by consumers of
// another kind (pgevents.GroupInUseError is the same type): HoldGroup and
// Commit return it while pgevents replicas of the group are live, a
// replica's start while a holder holds the group.
type GroupInUseError = store.GroupInUseError

// HoldGroup takes group's name, for db's session, for a consumer that is
// not a pgevents replica (the Kafka endpoint holds a Kafka group's name
// while the group has members), described by holder and detail: from then
// until ReleaseGroup or the session's end, the group's pgevents replicas
// refuse to start (`consumer run` exits 2, naming holder and detail) and a
// running one that was not live meanwhile (frozen, cut off) stops at its
// next heartbeat; its leases are freed at once, and a batch it still ran is
// ended. db must be one session (a *pgx.Conn or *pgxpool.Conn), not a pool.
// It returns a *GroupInUseError while a replica of the group is live.
// Holding it again on the same session only updates the description.
func HoldGroup(ctx context.Context, db schema.DB, group, holder, detail string) error {
	return store.HoldGroup(ctx, db, group, true, holder, detail)
}

// ReleaseGroup gives back the hold db's session took with HoldGroup, so
// that the group's pgevents replicas may run again; nothing when the
// session holds none.
func ReleaseGroup(ctx context.Context, db schema.DB, group string) error {
	return store.ReleaseGroup(ctx, db, group)
}

// GroupHolder describes who holds group's name (HoldGroup), or returns ""
// when nobody does.
func GroupHolder(ctx context.Context, db schema.DB, group string) (string, error) {
	return store.GroupHolder(ctx, db, group)
}
