package pgevents

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/lease"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/listener"
	"github.com/pgevents/pgevents/partition"
	"github.com/pgevents/pgevents/schema"
)

// ErrAlreadyStarted is returned by Run when it was called before on the
// same Consumer: a Consumer runs once; create another to run again.
var ErrAlreadyStarted = errors.New("pgevents: the consumer has been started already")

// ErrSubscriptionCancelled is returned by Run when the group's subscription
// is CANCELLED (consumer group cancel), a terminal state: the group's
// replicas stop, and a new group id is needed to consume the topic again.
var ErrSubscriptionCancelled = store.ErrCancelled

// ErrLeaseLost is the cause (context.Cause) of a handler's context that was
// cancelled because the replica lost the partition's lease: another
// replica took the partition over, the batch cannot commit, and effects
// outside PostgreSQL should stop rather than go on under a stale epoch.
var ErrLeaseLost = store.ErrLeaseLost

// GroupInUseError is returned by Run when a consumer of another kind (the
// Kafka endpoint's members of a Kafka group of the same name) holds the
// group's name: at start, or later when it took the name while this
// replica was not live (frozen or cut off). A group's name belongs to one
// kind of consumer at a time; stop the other one, or choose another
// groupId. It is offsets.GroupInUseError.
type GroupInUseError = store.GroupInUseError

// PartitionMismatchError is returned by Run when the configured partition
// count differs from the one the topic records.
type PartitionMismatchError struct {
	TopicID    int
	Configured int
	Recorded   int
}

// Error says what differs and what to do.
func (e *PartitionMismatchError) Error() string {
	return fmt.Sprintf("topic %d has %d partitions but the consumer is configured with totalPartitions %d; set totalPartitions: %d (or repartition the topic with `consumer repartition --topic %d --partitions %d`)",
		e.TopicID, e.Recorded, e.Configured, e.Recorded, e.TopicID, e.Configured)
}

// ChannelMismatchError is returned by Run when the configured notification
// channel differs from the topic's: the consumer would LISTEN where the
// topic's appends never NOTIFY, and learn of events only by polling.
type ChannelMismatchError struct {
	TopicID    int
	Configured string
	Recorded   string
}

// Error says what differs and what to do.
func (e *ChannelMismatchError) Error() string {
	return fmt.Sprintf("topic %d notifies channel %q but the consumer is configured with channel %q; set channel: %s (or run `consumer migrate` with channel: %s to move the topic)",
		e.TopicID, e.Recorded, e.Configured, e.Recorded, e.Configured)
}

// TimeoutError is returned by Run when HandlerTimeout plus a batch's
// round trips (idleSlack) does not fit in the idle_in_transaction_session_timeout
// of the pool's sessions: a handler that calls out without running SQL
// for its whole budget would have its session ended by the server, and
// its batch could never commit. The setting may come from the consumer's
// configuration or from the server (ALTER ROLE ... SET, ALTER DATABASE
// ... SET, postgresql.conf); Source and Role say which.
type TimeoutError struct {
	// HandlerTimeout is the consumer's Config.HandlerTimeout.
	HandlerTimeout time.Duration
	// IdleTimeout is the sessions' idle_in_transaction_session_timeout.
	IdleTimeout time.Duration
	// Source is where the sessions' setting comes from, as pg_settings
	// names it ("client" for the consumer's own, "user" for the role's,
	// "database", "database user", "configuration file", ...).
	Source string
	// Role is the sessions' role (current_user).
	Role string
}

// Error says what conflicts, where the setting comes from, and what to do.
func (e *TimeoutError) Error() string {
	return fmt.Sprintf("HandlerTimeout %s plus a batch's round trips (%s) must be shorter than the sessions' idle_in_transaction_session_timeout %s (%s, role %q); lower the handler timeout or raise the idle timeout",
		e.HandlerTimeout, idleSlack, e.IdleTimeout, settingSource(e.Source), e.Role)
}

// settingSource says in words where a session setting comes from, from
// its pg_settings source.
func settingSource(source string) string {
	switch source {
	case "client":
		return "set by the consumer's connection: idleInTransactionTimeoutMs or the URL"
	case "user":
		return "set for the role by ALTER ROLE ... SET"
	case "database":
		return "set for the database by ALTER DATABASE ... SET"
	case "database user":
		return "set for the role in this database by ALTER ROLE ... IN DATABASE ... SET"
	case "configuration file":
		return "set in the server's configuration file"
	case "default":
		return "the server's default"
	}
	return "source " + source
}

// Consumer runs a group's partition workers. Create it with NewConsumer and
// start it with Run.
type Consumer struct {
	pool    *pgxpool.Pool
	cfg     Config
	log     zerolog.Logger // with the group and the topic
	static  []int          // the partitions of a static replica; nil: auto mode
	start   StartPosition
	rt      atomic.Pointer[layoutRun]
	started atomic.Bool // Run was called
	paused  atomic.Bool // the subscription is PAUSED: handle nothing

	// topicLog is the logger with the group only, for the topic's
	// sequencer and maintenance, which add the topic themselves: a JSON
	// line must not carry a key twice.
	topicLog zerolog.Logger

	handled atomic.Int64
	batches atomic.Int64
	deadLet atomic.Int64
	retries atomic.Int64
	parked  atomic.Int64
	halts   atomic.Int64
	skipped atomic.Int64
	empty   atomic.Int64
	polls   atomic.Int64 // polls answered

	deployment atomic.Int64
	ln         atomic.Pointer[listener.Listener]
	kick       chan WakeSource // asks the poller to poll now
	// rechecks asks the subscription's loop to read the group's state
	// now, and haltChecks the halted workers to read their halt records
	// (recheck).
	rechecks   chan struct{}
	haltChecks broadcast
	replicaID  string
	clockSkew  atomic.Int64 // database clock minus local clock, ns
	// wakeAlways says that every append to the topic notifies
	// (schema.WakeAlways), or that the topic is sequenced (its ticks
	// notify every partition they move, whatever the mode: migration
	// 0023), so the watcher need not read the tails. The poller reads the
	// topic's mode again at every poll (refreshWake).
	wakeAlways atomic.Bool
	// sequenced says that the topic is sequenced (schema.ScopeSequenced),
	// which a topic is from its creation, and that its ticks announce every
	// partition they move (the schema is at tickAnnouncesVersion or later).
	sequenced bool
	// watch finds new events between notifications (watcher.go); it does
	// not run for a sequenced topic (sequenced).
	watch *watcher
	// trace starts the spans of batches and handler calls; nil when
	// Config.TracerProvider is (tracing.go).
	trace *tracing
	// idleCut is how long a batch may go without a statement of its own
	// before it stops taking units and commits, so that the server's
	// idle_in_transaction_session_timeout never ends it; 0: no limit.
	idleCut time.Duration
	// awaitMax bounds a claim's wait for an append in flight below the
	// sessions' statement_timeout (store.Claim.AwaitMax); 0: the default.
	awaitMax time.Duration
	// The failure states of the loops that retry against the database:
	// they pace the retries and keep a repeated failure to one line per
	// interval (internal/backoff).
	polling, beating, maintaining, layouts *backoff.Retry
	// batchLines limits the workers' lines about batches rolled back for a
	// transient or deployment failure to one per interval for the
	// consumer: in an outage every partition's batch fails, and retries.
	batchLines backoff.Limiter
}

// NewConsumer validates cfg, applies its defaults and returns a Consumer
// that runs on pool. The pool should allow PoolSize(partitions served)
// connections; fewer make workers wait for one.
func NewConsumer(pool *pgxpool.Pool, cfg Config) (*Consumer, error) {
	if pool == nil {
		return nil, errors.New("pgevents: pool is required")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	start, _ := ParseStartPosition(cfg.StartFrom) // validated
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = lease.NewReplicaID()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	var err error
	var static []int
	if cfg.Partitions != nil {
		if static, err = partition.Assign(cfg.TotalPartitions, cfg.Partitions); err != nil {
			return nil, fmt.Errorf("pgevents: %w", err)
		}
	}
	log := zerolog.Nop()
	if cfg.Logger != nil {
		log = *cfg.Logger
	}
	glog := log.With().Str("group", cfg.GroupID).Logger()
	c := &Consumer{
		pool:      pool,
		cfg:       cfg,
		log:       glog.With().Int("topic", cfg.TopicID).Logger(),
		topicLog:  glog,
		static:    static,
		start:     start,
		kick:      make(chan WakeSource, 1),
		rechecks:  make(chan struct{}, 1),
		replicaID: cfg.ReplicaID,
	}
	c.watch = newWatcher(c)
	c.newRetries()
	c.trace = newTracing(cfg.TracerProvider, cfg.GroupID, cfg.TopicID)
	return c, nil
}

// Stats are counters of a consumer since it started.
type Stats struct {
	// Handled counts events handled and committed (dead-lettered ones
	// excluded).
	Handled int64
	// Batches counts committed batches.
	Batches int64
	// EmptyClaims counts claims that found nothing to handle. A claim locks
	// the partition's offsets row, which writes WAL even when nothing
	// follows; a worker claims only when it knows of an offset beyond its
	// position, so this stays near zero (another replica handled it first).
	EmptyClaims int64
	// DeadLettered counts units written to dead_letter_queue.
	DeadLettered int64
	// Retries counts batches rolled back to be retried.
	Retries int64
	// DeploymentFailures counts failed batches whose cause says the
	// deployment is wrong (ClassDeployment).
	DeploymentFailures int64
	// ParkedUnits counts units parked behind a dead letter.
	ParkedUnits int64
	// Halts counts partitions halted.
	Halts int64
	// ListenerConnects counts successful connects of the listener.
	ListenerConnects int64
	// Skipped counts events retention removed before the group handled
	// them, as reported to this process.
	Skipped int64
	// Unserved is the number of partitions this consumer holds whose
	// batches are failing because they cannot get a database session
	// (SQLSTATE 53300, 57P03, connection failures); each is released
	// within SessionFailureBound.
	Unserved int
}

// Stats returns the consumer's counters.
func (c *Consumer) Stats() Stats {
	s := Stats{Handled: c.handled.Load(), Batches: c.batches.Load(), EmptyClaims: c.empty.Load(), DeadLettered: c.deadLet.Load(),
		Retries: c.retries.Load(), DeploymentFailures: c.deployment.Load(), ParkedUnits: c.parked.Load(), Halts: c.halts.Load(),
		Skipped: c.skipped.Load(), Unserved: c.unserved()}
	if ln := c.ln.Load(); ln != nil {
		s.ListenerConnects = ln.Connects()
	}
	return s
}

// Partitions returns the partitions whose lease this consumer holds, in
// ascending order.
func (c *Consumer) Partitions() []int {
	if rt := c.rt.Load(); rt != nil {
		return rt.leaser.Held()
	}
	return nil
}

// Owned returns the number of partitions whose lease this consumer holds
// and whose worker is not halted.
func (c *Consumer) Owned() int {
	rt := c.rt.Load()
	if rt == nil {
		return 0
	}
	n := 0
	for _, p := range rt.leaser.Held() {
		if w := rt.workers[p]; w != nil && !w.halted.Load() {
			n++
		}
	}
	return n
}

// ReplicaID returns the id under which this consumer holds leases.
func (c *Consumer) ReplicaID() string { return c.replicaID }

// Run checks the topic, creates the group's positions where it has none,
// and runs the listener, the poller and one worker per partition until ctx
// is cancelled. Then each worker finishes (commits or rolls back) its
// in-flight batch within ShutdownTimeout, and Run returns nil. It returns an
// error when the consumer cannot start, when the topic's partition count
// differs from the configuration (*PartitionMismatchError), or when a
// consumer of another kind holds the group's name (*GroupInUseError): find
// them with errors.As. A Consumer runs once: a second call returns
// ErrAlreadyStarted. Every error it returns starts with "pgevents: ".
func (c *Consumer) Run(ctx context.Context) error {
	return prefixed(c.run(ctx))
}

// run is Run without the package's prefix on its errors.
func (c *Consumer) run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return ErrAlreadyStarted
	}
	ctx = schema.WithName(ctx, c.cfg.Schema)
	// The start's statements are retried while they fail for a reason
	// that passes (a statement cancelled by a role's short
	// statement_timeout on a busy server, a connection lost): exiting would
	// make the service manager restart the process into the same wait.
	// What says the deployment is wrong (a topic that does not exist, a
	// configuration that contradicts the database) ends Run at once.
	starting := backoff.New(c.log, "start")
	var topic schema.Topic
	for {
		var err error
		if topic, err = c.prepare(ctx); err == nil {
			starting.Ok()
			break
		}
		if Classify(err) != ClassTransient || ctx.Err() != nil {
			return err
		}
		if !backoff.Sleep(ctx, starting.Fail(err, "could not start; retrying")) {
			return nil
		}
	}

	ln, err := listener.New(listener.Config{
		ConnConfig: c.pool.Config().ConnConfig,
		Channel:    topic.Channel,
		// The canary goes on the listener's own session, which also runs
		// the consumer's upkeep (control): no pool session for either.
		Logger: &c.log,
		Sink:   (*sink)(c),
	})
	if err != nil {
		return err
	}
	c.ln.Store(ln)

	// Batches run on a context that outlives ctx by ShutdownTimeout, so an
	// in-flight batch can commit after a shutdown request.
	batchCtx, cancelBatches := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBatches()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownTimeout, cancelBatches) })
	defer stop()

	c.log.Info().Str("replica", c.replicaID).Int("batch_size", c.cfg.BatchSize).Msg("consumer starting")
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ln.Run(gctx) })
	g.Go(func() error { return c.poll(gctx) })
	if !c.sequenced {
		// A sequenced topic's ticks announce every partition they move:
		// nothing is left to watch, and the watcher's session (the watch
		// key's, held or waited for) is not taken.
		g.Go(func() error { return c.watch.run(gctx) })
	}
	g.Go(func() error { return c.consume(gctx, batchCtx) })
	g.Go(func() error { return c.subscription(gctx) })
	g.Go(func() error { return c.maintain(gctx) })
	g.Go(func() error {
		// Its ticks' announcements wake this consumer's workers on the
		// sequencer's session, before its listener hears them.
		local := &localTicks{channel: ln.Channel, announce: c.ticked}
		err := sequence(gctx, c.pool, c.cfg.TopicID, c.replicaID, &c.topicLog, local)
		if errors.Is(err, ErrNotSequenced) {
			return nil
		}
		return err
	})
	err = g.Wait()
	c.log.Info().Int64("handled", c.handled.Load()).Msg("consumer stopped")
	if err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// prepare runs the start's checks and registrations, each idempotent (Run
// retries them): the topic and its partition count, scope and channel,
// the sessions' timeouts, the group's subscription, its name's holder,
// the skips retention reported, and the group's layout. It returns the
// topic.
func (c *Consumer) prepare(ctx context.Context) (schema.Topic, error) {
	topic, err := schema.LookupTopic(ctx, c.pool, c.cfg.TopicID)
	if err != nil {
		return topic, err
	}
	if topic.Partitions != c.cfg.TotalPartitions {
		return topic, &PartitionMismatchError{TopicID: topic.ID, Configured: c.cfg.TotalPartitions, Recorded: topic.Partitions}
	}
	if topic.Scope == schema.ScopeSequenced {
		// A tick announces every partition it moves from migration 0023
		// on; before it, a schema another tool migrates later has ticks
		// that notify only sleeping partitions, which the watcher keeps.
		v, err := schema.Version(ctx, c.pool)
		if err != nil {
			return topic, err
		}
		c.sequenced = v >= tickAnnouncesVersion
	}
	c.wakeAlways.Store(c.notifiesAlways(topic.Wake))
	if c.cfg.Channel != "" && topic.Channel != c.cfg.Channel {
		return topic, &ChannelMismatchError{TopicID: topic.ID, Configured: c.cfg.Channel, Recorded: topic.Channel}
	}
	c.warnSharedChannel(ctx, topic.Channel)
	if err := c.checkTimeouts(ctx); err != nil {
		return topic, err
	}
	state, isNew, err := store.Subscribe(ctx, c.pool, c.cfg.GroupID, c.cfg.TopicID, c.start.internal(), c.cfg.DeadAfter)
	if err != nil {
		return topic, err
	}
	if state == store.StateCancelled {
		return topic, fmt.Errorf("group %q on topic %d: %w", c.cfg.GroupID, c.cfg.TopicID, ErrSubscriptionCancelled)
	}
	if isNew {
		c.log.Info().Str("start_from", c.start.String()).Msg("new group: subscribed to the topic")
	}
	c.setState(state)
	// A group's name belongs to one kind of consumer at a time: a Kafka
	// group of the same name with members refuses this one (the
	// replica's registration refuses it too, when the name is taken
	// between this look and the first heartbeat).
	if by, err := store.GroupHolder(ctx, c.pool, c.cfg.GroupID); err != nil {
		return topic, err
	} else if by != "" {
		return topic, &GroupInUseError{Group: c.cfg.GroupID, By: by}
	}
	c.reportSkips(ctx)
	// Groups from before subscriptions and layouts existed.
	if err := store.InitGroupLayout(ctx, c.pool, c.cfg.GroupID, c.cfg.TopicID); err != nil {
		return topic, err
	}
	return topic, nil
}

// notifiesAlways reports whether every event of the topic is announced by
// a notification, wake being the topic's wake-up mode: in mode 'always',
// or when the topic is sequenced (its ticks notify every partition they
// move, whatever the mode). The watcher then need not read the tails.
func (c *Consumer) notifiesAlways(wake string) bool {
	return wake == schema.WakeAlways || c.sequenced
}

// tickAnnouncesVersion is the schema version from which a sequenced
// topic's ticks notify every partition they move (migration 0023).
const tickAnnouncesVersion = 23

// Ready reports whether the consumer's listener is connected.
func (c *Consumer) Ready() bool {
	ln := c.ln.Load()
	return ln != nil && ln.Ready()
}

// warnSharedChannel logs the topics of other pgevents installations of
// the database (schema key) that notify channel too: their appends wake
// this consumer to look for nothing. A notification is only a hint, so
// nothing is lost or skipped; see schema.ChannelFor.
func (c *Consumer) warnSharedChannel(ctx context.Context, channel string) {
	users, err := schema.ChannelUsers(ctx, c.pool, channel)
	if err != nil {
		c.log.Debug().Err(err).Msg("could not look for other installations on the channel")
		return
	}
	for _, u := range users {
		c.log.Warn().Str("channel", channel).Str("other_schema", u.Schema).Int("other_topic", u.Topic).
			Msg("another pgevents installation in this database notifies the same channel: its appends wake this consumer for nothing; give one of them another channel (key channel)")
	}
}
