package lease

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

// Lease statements. Each runs as one statement or one pipelined batch
// without BEGIN, so it completes on the server whatever happens to the
// client: a replica frozen mid-heartbeat holds no lease row locked.
//
// A lease row (owner, epoch) changes only when its owner does: acquired,
// released, or freed by a layout switch. Liveness is the replica's: the
// heartbeat renews the replica's consumer_replicas row, and a lease is live
// while its owner's row is. So the lease checks of every batch read a row
// that no heartbeat updates (an open snapshot elsewhere makes every version
// of a row updated three times a second stay, and each lookup walk them).
const (
	// registerSQL records the replica as live until now + lease, unless a
	// consumer of another kind holds the group's name (register_replica,
	// migration 0018: SQLSTATE PGG02, and the replica is not live).
	registerSQL = `SELECT {schema}register_replica($1, $2, $3, $4, $5, $6, $7::interval)`

	// ownedSQL returns the leases the replica owns, live or not (its own
	// row, registered just before, makes them live again): a lease still
	// owned was taken by nobody (taking it changes the owner), so it is
	// safe to keep. It returns too the leases of partitions $4, those the
	// replica holds, whoever owns them now: a held lease owned by another
	// replica was taken over; one owned by nobody (or gone) was freed by
	// the group's reset or layout switch, which gave the partitions new
	// positions. Then the group's layout version, whose change tells a
	// layout switch from a reset.
	ownedSQL = `SELECT partition_id, epoch, owner, (SELECT version FROM {schema}group_layouts WHERE group_id = $1 AND topic_id = $2)
FROM {schema}partition_leases
WHERE group_id = $1 AND topic_id = $2 AND (owner = $3 OR partition_id = ANY($4::integer[]))`

	// liveReplicasSQL lists the live auto-mode replicas, in id order: the
	// order that decides who holds one partition more when they do not
	// divide evenly.
	liveReplicasSQL = `SELECT replica_id FROM {schema}consumer_replicas
WHERE group_id = $1 AND topic_id = $2 AND mode = 'auto' AND expires_at > clock_timestamp()
ORDER BY replica_id`

	// acquireSQL takes up to $5 free leases, or leases whose owner is no
	// longer live, among partitions $4, bumping their epoch, while the group
	// consumes layout $6 (0: any). A live lease is never taken, and SKIP
	// LOCKED keeps replicas that acquire at once from waiting on each other.
	// The layout check keeps a replica still running the layout its group
	// just left (another replica switched) from taking the next layout's
	// leases, which the switch freed, for workers that do not serve them.
	//
	// The acquisition commits synchronously (set_config(..., true) lasts
	// until the statement's own transaction commits), although consumer
	// connections otherwise commit asynchronously: a server crash must not
	// lose an epoch bump, or the next acquisition would hand out the same
	// epoch again and two owners would act under one fencing token.
	acquireSQL = `WITH sync AS (
    SELECT set_config('synchronous_commit', 'on', true)
), cand AS (
    SELECT l.partition_id, l.owner AS prev_owner FROM {schema}partition_leases l
    WHERE l.group_id = $1 AND l.topic_id = $2 AND l.partition_id = ANY($4::integer[])
      AND (l.owner = '' OR NOT EXISTS (SELECT 1 FROM {schema}consumer_replicas r
                                       WHERE r.group_id = l.group_id AND r.topic_id = l.topic_id
                                         AND r.replica_id = l.owner AND r.expires_at > clock_timestamp()))
      AND ($6 = 0 OR EXISTS (SELECT 1 FROM {schema}group_layouts g WHERE g.group_id = $1 AND g.topic_id = $2 AND g.version = $6))
    ORDER BY l.partition_id
    LIMIT $5
    FOR UPDATE OF l SKIP LOCKED
)
UPDATE {schema}partition_leases l
SET owner = $3, epoch = l.epoch + 1, acquired_at = clock_timestamp()
FROM cand CROSS JOIN sync
WHERE l.group_id = $1 AND l.topic_id = $2 AND l.partition_id = cand.partition_id
RETURNING l.partition_id, l.epoch, cand.prev_owner`

	// releaseSQL frees a lease the replica owns with that epoch.
	releaseSQL = `UPDATE {schema}partition_leases SET owner = ''
WHERE group_id = $1 AND topic_id = $2 AND partition_id = $3 AND owner = $4 AND epoch = $5`

	// releaseAllSQL frees every lease of the replica and removes it from
	// the live replicas, at shutdown: the others take over at once instead
	// of after the lease expires.
	releaseAllSQL = `WITH r AS (
    DELETE FROM {schema}consumer_replicas WHERE group_id = $1 AND topic_id = $2 AND replica_id = $3
)
UPDATE {schema}partition_leases SET owner = ''
WHERE group_id = $1 AND topic_id = $2 AND owner = $3`

	// fenceSQL ends the previous owner's batch, frozen or cut off, if it
	// still holds the partition's position lock; the new owner's claim
	// would otherwise wait for that transaction until the server noticed
	// the dead peer. The lock is an advisory lock (lock_position), found in
	// pg_locks by its key's halves; and a batch holds its owner's batch key
	// for its duration (SQL claim_state, batch_backends). Only a backend
	// that holds both is ended: the position lock may also be held by a
	// dead-letter replay, an offsets reset or a layout switch, which are
	// not the stale owner's.
	fenceSQL = `WITH k AS (
    SELECT {schema}lock_key('position', $1::text || '/' || $2::integer || '/' || $3::integer) AS key
)
SELECT count(pg_terminate_backend(l.pid))
FROM k
JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid
WHERE l.pid <> pg_backend_pid() AND l.pid IN (SELECT b.pid FROM {schema}batch_backends($4) b)`
)

// Fence ends the batch that replica prev runs on partition of group's
// topic, if it still holds the partition's position lock (see fenceSQL),
// and returns how many server processes it ended: what a replica that
// takes a partition over from prev does first, so that prev's batch,
// frozen or cut off, commits nothing and its claim does not wait.
func Fence(ctx context.Context, db schema.DB, group string, topic, partition int, prev string) (int, error) {
	var n int
	if err := db.QueryRow(ctx, schema.SQL(ctx, fenceSQL), group, topic, partition, prev).Scan(&n); err != nil {
		return 0, fmt.Errorf("partition: fence %s: %w", prev, err)
	}
	return n, nil
}

// Owner is told what a Leaser acquires and loses. Its methods are called
// from the Leaser's goroutine and must not block.
type Owner interface {
	// Acquired says the replica now owns partition p's lease with epoch.
	Acquired(p int, epoch int64)
	// Lost says the replica no longer owns partition p's lease: another
	// replica took it over, or the group's reset or layout switch freed
	// it. The partition's in-flight batch, if any, cannot commit.
	Lost(p int)
	// Release asks that partition p stop after its current batch; its
	// worker then calls Leaser.Released.
	Release(p int)
}

// LeaserConfig configures a Leaser.
type LeaserConfig struct {
	// DB runs the lease statements; required.
	DB schema.DB
	// Group and Topic say whose partitions are leased.
	Group string
	Topic int
	// Partitions is the topic's partition count.
	Partitions int
	// Layout is the version of the group's layout the replica consumes: it
	// acquires leases only while the group consumes it (0: whatever the
	// group's layout).
	Layout int
	// Static lists the partitions a static replica serves; nil means auto
	// mode, where live replicas share every partition.
	Static []int
	// ReplicaID names this replica; default NewReplicaID().
	ReplicaID string
	// Lease is how long a lease lives without a heartbeat; default 1 s. The
	// heartbeat runs every Lease/3.
	Lease time.Duration
	// Owner is told what is acquired and lost; required.
	Owner Owner
	// Ready, when set, is asked before each acquisition whether the
	// replica can serve more partitions (it can open the sessions their
	// batches need); an error skips the acquisition until a later
	// heartbeat: the replica steps back (StepBack), so that a replica
	// short of sessions takes nothing it would stall and does not count
	// among the live replicas that share the partitions. nil: always ready.
	Ready func(ctx context.Context) error
	// Logger receives lease changes; default: discard.
	Logger *zerolog.Logger
}

// Leaser keeps one replica's partition leases for one group: it registers
// the replica, renews what it holds, acquires what its share lacks, asks
// the owner to release what exceeds it, and fences the previous owner's
// backend after a takeover. Create it with NewLeaser and run it with Run.
type Leaser struct {
	cfg      LeaserConfig
	log      zerolog.Logger
	hostname string
	retry    *backoff.Retry // the heartbeat's failures

	mu        sync.Mutex
	held      map[int]int64 // partition → epoch
	releasing map[int]bool
	freeing   map[int]bool // Released is freeing the lease in the database
	beats     int

	// StepBack's state: the replica stays out of the group until
	// awayUntil; steps counts the step-backs closer than StepBackReset to
	// each other, for the back-off; gone says ReleaseAll has freed its
	// leases and removed it from the live replicas.
	awayUntil time.Time
	lastStep  time.Time
	steps     int
	gone      bool
}

// Step-back back-off: how long a replica that could not serve a partition
// stays out of the group (StepBack), doubling with each step-back that
// follows the previous one within StepBackReset.
const (
	// StepBackMin is the first step-back's length.
	StepBackMin = 2 * time.Second
	// StepBackMax caps a step-back's length.
	StepBackMax = time.Minute
	// StepBackReset is how long after a step-back the next one starts the
	// back-off afresh.
	StepBackReset = 5 * time.Minute
)

// NewLeaser validates cfg and returns a Leaser.
func NewLeaser(cfg LeaserConfig) (*Leaser, error) {
	if cfg.DB == nil || cfg.Owner == nil || cfg.Group == "" || cfg.Partitions <= 0 {
		return nil, errors.New("partition: DB, Owner, Group and Partitions are required")
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = NewReplicaID()
	}
	if cfg.Lease <= 0 {
		cfg.Lease = time.Second
	}
	for _, p := range cfg.Static {
		if p < 0 || p >= cfg.Partitions {
			return nil, fmt.Errorf("partition: partition %d is outside [0, %d)", p, cfg.Partitions)
		}
	}
	log := zerolog.Nop()
	if cfg.Logger != nil {
		log = *cfg.Logger
	}
	host, _ := os.Hostname()
	log = log.With().Str("replica", cfg.ReplicaID).Logger()
	return &Leaser{
		cfg:       cfg,
		log:       log,
		hostname:  host,
		retry:     backoff.New(log, "lease heartbeat").Periodic(cfg.Lease / 3),
		held:      map[int]int64{},
		releasing: map[int]bool{},
		freeing:   map[int]bool{},
	}, nil
}

// NewReplicaID returns an id for a replica: host name, process id and a
// random suffix, so that a restarted process is a new replica, and so are
// two consumers of one group in one process (the suffix is 32 random bits,
// not the clock's low bits, which repeat).
func NewReplicaID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return fmt.Sprintf("%s-%d-%x", host, os.Getpid(), b)
}

// ReplicaID returns the replica's id.
func (l *Leaser) ReplicaID() string { return l.cfg.ReplicaID }

// Held returns the partitions the replica holds, sorted.
func (l *Leaser) Held() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]int, 0, len(l.held))
	for p := range l.held {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Run heartbeats every Lease/3 until ctx is cancelled. It does not release
// the leases then: call ReleaseAll once the partitions' workers are done.
// While the heartbeat fails, it backs off from Lease/3 to 5 s (or Lease/3
// when longer), with jitter, and logs the failure once per
// backoff.DefaultInterval. It returns a *store.GroupInUseError when the
// database refuses the heartbeat because a consumer of another kind (the
// Kafka endpoint's group members) holds the group's name.
func (l *Leaser) Run(ctx context.Context) error {
	t := time.NewTicker(l.cfg.Lease / 3)
	defer t.Stop()
	for {
		if err := l.beat(ctx); err != nil {
			if inUse := (*store.GroupInUseError)(nil); errors.As(err, &inUse) && ctx.Err() == nil {
				// Another kind of consumer took the group's name while
				// this replica was not live (frozen, cut off): its leases
				// are gone, and it must not come back.
				return err
			}
			if ctx.Err() != nil || !backoff.Sleep(ctx, l.retry.Fail(err, "lease heartbeat failed")) {
				return nil
			}
			t.Reset(l.cfg.Lease / 3)
			continue
		}
		l.retry.Ok()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// StepBack takes the replica out of the group for a while, because it
// cannot serve a partition it holds (its batches cannot get a database
// session): the next heartbeat asks the Owner to release every held
// partition, frees the replica's leases and removes it from the live
// replicas (ReleaseAll), so the others' shares grow to cover them; no
// heartbeat registers it until the step-back ends. Should ReleaseAll fail
// too, the replica's row expires after Lease, unrenewed, and the others
// take its leases over. The step-back lasts StepBackMin, doubling up to
// StepBackMax while step-backs follow each other within StepBackReset.
// It returns the step-back's length; a call during a step-back extends
// nothing. why says what the replica could not do, for the log.
func (l *Leaser) StepBack(why error) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.Before(l.awayUntil) {
		return l.awayUntil.Sub(now)
	}
	if now.Sub(l.lastStep) > StepBackReset {
		l.steps = 0
	}
	l.steps++
	d := backoff.Delay(StepBackMin, StepBackMax, l.steps)
	l.awayUntil, l.lastStep, l.gone = now.Add(d), now, false
	l.log.Warn().Err(why).Int64("away_ms", d.Milliseconds()).Int("step_backs", l.steps).Msg("replica steps back from its group: it cannot open the sessions its partitions need; rejoining later")
	return d
}

// Away reports whether the replica is stepping back (StepBack).
func (l *Leaser) Away() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Now().Before(l.awayUntil)
}

// away is a heartbeat during a step-back: release what is held, then
// leave the live replicas, once.
func (l *Leaser) away(ctx context.Context) error {
	l.mu.Lock()
	var rel []int
	for p := range l.held {
		if !l.releasing[p] {
			l.releasing[p] = true
			rel = append(rel, p)
		}
	}
	gone := l.gone
	l.mu.Unlock()
	for _, p := range rel {
		l.cfg.Owner.Release(p)
	}
	if gone {
		return nil
	}
	if err := l.ReleaseAll(ctx); err != nil {
		return err
	}
	l.mu.Lock()
	l.gone = true
	l.mu.Unlock()
	return nil
}

// beat renews, then rebalances.
func (l *Leaser) beat(ctx context.Context) error {
	if l.Away() {
		return l.away(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Lease)
	defer cancel()
	mode := "auto"
	if l.cfg.Static != nil {
		mode = "static"
	}
	lease := l.cfg.Lease.String()
	l.mu.Lock()
	holding := make([]int32, 0, len(l.held))
	for p := range l.held {
		holding = append(holding, int32(p))
	}
	l.mu.Unlock()
	var b pgx.Batch
	b.Queue(schema.SQL(ctx, registerSQL), l.cfg.Group, l.cfg.Topic, l.cfg.ReplicaID, mode, l.hostname, os.Getpid(), lease)
	b.Queue(schema.SQL(ctx, ownedSQL), l.cfg.Group, l.cfg.Topic, l.cfg.ReplicaID, holding)
	b.Queue(schema.SQL(ctx, liveReplicasSQL), l.cfg.Group, l.cfg.Topic)
	br := l.cfg.DB.SendBatch(ctx, &b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return fmt.Errorf("partition: register replica: %w", store.GroupInUse(l.cfg.Group, err))
	}
	rows, _ := br.Query()
	renewed := map[int]int64{}
	owners := map[int]string{} // of the held partitions, whoever owns them
	var (
		p       int
		epoch   int64
		owner   string
		version *int
	)
	_, err := pgx.ForEachRow(rows, []any{&p, &epoch, &owner, &version}, func() error {
		if owner == l.cfg.ReplicaID {
			renewed[p] = epoch
		}
		owners[p] = owner
		return nil
	})
	if err != nil {
		br.Close()
		return fmt.Errorf("partition: renew leases: %w", err)
	}
	rows, _ = br.Query()
	live, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		br.Close()
		return fmt.Errorf("partition: live replicas: %w", err)
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("partition: heartbeat: %w", err)
	}

	// The database says what the replica owns: what it renewed. A lease held
	// here and not renewed was taken over. A lease renewed and not held
	// here is one whose acquisition committed while its answer was lost (a
	// deadline, a dead connection): it is the replica's, under the epoch
	// the database gave it, so the replica takes it up. Left alone, it
	// would be renewed at every beat and served by nobody.
	l.mu.Lock()
	var freed []int
	for p := range l.held {
		if e, ok := renewed[p]; !ok || e != l.held[p] {
			delete(l.held, p)
			delete(l.releasing, p)
			if o := owners[p]; o != "" && o != l.cfg.ReplicaID {
				l.log.Warn().Int("partition", p).Str("owner", o).Msg("partition lease lost to another replica")
			} else {
				freed = append(freed, p)
			}
			l.cfg.Owner.Lost(p)
		}
	}
	if len(freed) > 0 {
		// Freed, not taken: the group's reset or layout switch gave every
		// partition a new position and a free lease at once. Said once.
		slices.Sort(freed)
		if version != nil && l.cfg.Layout != 0 && *version != l.cfg.Layout {
			l.log.Info().Ints("partitions", freed).Int("layout", *version).Msg("the group moved to a new layout: leaving this one's partitions")
		} else {
			l.log.Info().Ints("partitions", freed).Msg("the group's positions were reset by an operator: its partitions continue from the new positions")
		}
	}
	for p, e := range renewed {
		if _, ok := l.held[p]; ok || l.freeing[p] {
			continue
		}
		l.held[p] = e
		l.log.Warn().Int("partition", p).Int64("epoch", e).Msg("holding a partition's lease without knowing it (an acquisition's answer was lost): taking it up")
		l.cfg.Owner.Acquired(p, e)
	}
	held := len(l.held)
	releasing := len(l.releasing)
	l.beats++
	l.mu.Unlock()

	want := l.cfg.Static
	target := len(want)
	if want == nil {
		want = make([]int, l.cfg.Partitions)
		for i := range want {
			want[i] = i
		}
		target = Target(l.cfg.Partitions, live, l.cfg.ReplicaID)
	}
	switch have := held - releasing; {
	case have < target:
		if l.cfg.Ready != nil {
			if err := l.cfg.Ready(ctx); err != nil {
				// Live without taking its share, the replica would keep
				// the others below the whole: step back instead, so
				// that they cover it.
				l.StepBack(err)
				return l.away(ctx)
			}
		}
		return l.acquire(ctx, want, target-have)
	case have > target:
		l.releaseSurplus(have - target)
	}
	return nil
}

// acquire takes up to n free or expired leases among want.
func (l *Leaser) acquire(ctx context.Context, want []int, n int) error {
	rows, err := l.cfg.DB.Query(ctx, schema.SQL(ctx, acquireSQL), l.cfg.Group, l.cfg.Topic, l.cfg.ReplicaID, want, n, l.cfg.Layout)
	if err != nil {
		return fmt.Errorf("partition: acquire: %w", err)
	}
	type got struct {
		p     int
		epoch int64
		prev  string
	}
	var acquired []got
	var g got
	if _, err := pgx.ForEachRow(rows, []any{&g.p, &g.epoch, &g.prev}, func() error {
		acquired = append(acquired, g)
		return nil
	}); err != nil {
		return fmt.Errorf("partition: acquire: %w", err)
	}
	for _, a := range acquired {
		if a.prev != "" && a.prev != l.cfg.ReplicaID {
			// Taken over from a replica whose lease expired: end its
			// batch, if it still holds the partition's offsets row.
			if n, err := Fence(ctx, l.cfg.DB, l.cfg.Group, l.cfg.Topic, a.p, a.prev); err != nil {
				l.log.Warn().Err(err).Int("partition", a.p).Msg("could not fence the previous owner")
			} else if n > 0 {
				l.log.Warn().Int("partition", a.p).Str("previous_owner", a.prev).Msg("ended the previous owner's batch")
			}
			l.log.Info().Int("partition", a.p).Int64("epoch", a.epoch).Str("previous_owner", a.prev).Msg("partition taken over")
		} else {
			l.log.Info().Int("partition", a.p).Int64("epoch", a.epoch).Msg("partition acquired")
		}
		l.mu.Lock()
		l.held[a.p] = a.epoch
		l.mu.Unlock()
		l.cfg.Owner.Acquired(a.p, a.epoch)
	}
	return nil
}

// releaseSurplus asks the owner to release n partitions, the highest ones,
// after their current batch.
func (l *Leaser) releaseSurplus(n int) {
	l.mu.Lock()
	var cand []int
	for p := range l.held {
		if !l.releasing[p] {
			cand = append(cand, p)
		}
	}
	slices.Sort(cand)
	slices.Reverse(cand)
	cand = cand[:min(n, len(cand))]
	for _, p := range cand {
		l.releasing[p] = true
	}
	l.mu.Unlock()
	for _, p := range cand {
		l.log.Info().Int("partition", p).Msg("releasing surplus partition after its current batch")
		l.cfg.Owner.Release(p)
	}
}

// Released frees partition p's lease once its worker has stopped, if the
// replica still owns it with epoch.
//
// The lease is freed under the epoch the Leaser holds it with, whatever
// the caller's (a worker that saw its lease lost passes 0). If freeing it
// fails, the next heartbeat finds the lease still owned and takes it up
// again.
func (l *Leaser) Released(ctx context.Context, p int, epoch int64) error {
	l.mu.Lock()
	if e, ok := l.held[p]; ok {
		epoch = e
	}
	delete(l.held, p)
	delete(l.releasing, p)
	l.freeing[p] = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.freeing, p)
		l.mu.Unlock()
	}()
	if _, err := l.cfg.DB.Exec(ctx, schema.SQL(ctx, releaseSQL), l.cfg.Group, l.cfg.Topic, p, l.cfg.ReplicaID, epoch); err != nil {
		return fmt.Errorf("partition: release %d: %w", p, err)
	}
	return nil
}

// ReleaseAll frees every lease of the replica and unregisters it.
func (l *Leaser) ReleaseAll(ctx context.Context) error {
	l.mu.Lock()
	l.held = map[int]int64{}
	l.releasing = map[int]bool{}
	l.mu.Unlock()
	if _, err := l.cfg.DB.Exec(ctx, schema.SQL(ctx, releaseAllSQL), l.cfg.Group, l.cfg.Topic, l.cfg.ReplicaID); err != nil {
		return fmt.Errorf("partition: release all: %w", err)
	}
	return nil
}

// Target returns how many of n partitions replica me should hold when the
// live auto-mode replicas are live, sorted by id: ⌈n/R⌉ for the first n mod
// R of them and ⌊n/R⌋ for the others, so every replica knows its share
// without talking to the others. A replica not yet among them counts as one
// more, placed by its id.
func Target(n int, live []string, me string) int {
	if !slices.Contains(live, me) {
		live = append(slices.Clone(live), me)
		slices.Sort(live)
	}
	r := len(live)
	i := slices.Index(live, me)
	t := n / r
	if i < n%r {
		t++
	}
	return t
}
