package consumercli

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/metrics"
	"github.com/pgevents/pgevents/schema"
)

// observability is the run command's Prometheus metrics and their HTTP
// server (/metrics, /healthz, /readyz, and /debug/pprof/ with pprof: true),
// configured by metricsAddr and pprof, for every group the process runs.
//
// A consumer needs the Observer in its Config before it exists, and the
// server needs the consumer (readiness, partitions owned) after: so the
// server starts first, reports not ready, and Attach hands it each
// consumer once created.
type observability struct {
	groups []*groupMetrics // nil when metricsAddr is empty
	addr   string          // the address served, with the port chosen
}

// groupMetrics are one group's metrics and consumer.
type groupMetrics struct {
	metrics  *metrics.Metrics
	consumer atomic.Pointer[pgevents.Consumer]
}

// startObservability creates the metrics of each group of cfg, whose lag
// is read on the group's pool (pools, in GroupConfigs order) and, when
// cfg.MetricsAddr is set, listens on it (so a busy address fails before
// the consumers start) and serves in g until ctx ends; /readyz checks
// every pool. With no metricsAddr it does nothing, and Observer returns
// nil.
func startObservability(ctx context.Context, g *errgroup.Group, cfg *config.Config, pools []*pgxpool.Pool, log *zerolog.Logger) (*observability, error) {
	o := &observability{}
	if cfg.MetricsAddr == "" {
		return o, nil
	}
	var all []*metrics.Metrics
	for i, gc := range cfg.GroupConfigs() {
		var parts []int
		if gc.PartitionID >= 0 {
			parts = []int{gc.PartitionID}
		} else {
			for p := range gc.TotalPartitions {
				parts = append(parts, p)
			}
		}
		m, err := metrics.New(metrics.Options{Group: gc.GroupID, Topic: gc.TopicID, Partitions: parts, DB: pools[i], Schema: gc.Schema,
			NoRuntimeMetrics: i > 0})
		if err != nil {
			return nil, err
		}
		if i == 0 {
			m.Registry().MustRegister(sinkMetrics) // the relays of every group
		}
		gm := &groupMetrics{metrics: m}
		m.SetListenerConnectedFunc(gm.ready)
		m.SetPartitionsOwnedFunc(gm.owned)
		m.SetPartitionsUnservedFunc(gm.unserved)
		o.groups = append(o.groups, gm)
		all = append(all, m)
	}
	dbs := distinctPools(pools)
	var more []schema.DB
	for _, p := range dbs[1:] {
		more = append(more, p)
	}
	srv, err := metrics.NewServer(metrics.ServerConfig{
		Addr:    cfg.MetricsAddr,
		Metrics: metrics.Handler(all...),
		DB:      dbs[0],
		MoreDBs: more,
		Ready:   o.ready,
		Pprof:   cfg.Pprof,
	})
	if err != nil {
		return nil, fmt.Errorf("metricsAddr %s: %w", cfg.MetricsAddr, err)
	}
	o.addr = srv.Addr()
	if log != nil {
		log.Info().Str("addr", o.addr).Bool("pprof", cfg.Pprof).Msg("metrics server listening")
	}
	g.Go(func() error { return srv.Run(ctx) })
	return o, nil
}

// Observer returns the Observer to set in the Config of group i (in
// cfg.GroupConfigs() order): nil (none) when metrics are off.
func (o *observability) Observer(i int) pgevents.Observer {
	if o.groups == nil {
		return nil
	}
	return o.groups[i].metrics
}

// Attach gives the server group i's consumer, whose readiness and
// partitions it reports. Until every group's is attached, /readyz answers
// 503.
func (o *observability) Attach(i int, c *pgevents.Consumer) {
	if o.groups != nil {
		o.groups[i].consumer.Store(c)
	}
}

// ready reports whether every group's consumer has its listener connected.
func (o *observability) ready() bool {
	for _, gm := range o.groups {
		if !gm.ready() {
			return false
		}
	}
	return true
}

// ready reports whether the group's consumer has its listener connected.
func (gm *groupMetrics) ready() bool {
	c := gm.consumer.Load()
	return c != nil && c.Ready()
}

// owned returns the number of partitions the group's consumer holds and
// has not halted.
func (gm *groupMetrics) owned() int {
	if c := gm.consumer.Load(); c != nil {
		return c.Owned()
	}
	return 0
}

// unserved returns the number of partitions the group's consumer holds
// whose batches cannot get a database session.
func (gm *groupMetrics) unserved() int {
	if c := gm.consumer.Load(); c != nil {
		return c.Stats().Unserved
	}
	return 0
}

// runConsumers creates a consumer per configuration in ccfgs (one per group
// of cfg, in cfg.GroupConfigs() order), each on its group's pool (pools,
// in the same order: a pool per database), and runs them, with the
// metrics server when cfg.MetricsAddr is set, the console and the Kafka
// endpoint when the file has their sections, until ctx ends or one
// fails; it returns the first error (Run's errors unchanged, in a
// *groupFailure naming the group when the file lists several), and nil
// after a shutdown, which stops them all together.
func runConsumers(ctx context.Context, cfg *config.Config, pools []*pgxpool.Pool, ccfgs []pgevents.Config) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	var log *zerolog.Logger
	if len(ccfgs) > 0 {
		log = ccfgs[0].Logger
	}
	obs, err := startObservability(gctx, g, cfg, pools, log)
	if err != nil {
		return err
	}
	// failed names the group of err when the file lists several.
	failed := func(i int, err error) error {
		if err == nil || len(ccfgs) < 2 {
			return err
		}
		return &groupFailure{group: i, id: ccfgs[i].GroupID, err: err}
	}
	consumers := make([]*pgevents.Consumer, len(ccfgs))
	for i, ccfg := range ccfgs {
		if o := obs.Observer(i); o != nil {
			ccfg.Observer = o
		}
		if consumers[i], err = pgevents.NewConsumer(pools[i], ccfg); err != nil {
			cancel()
			_ = g.Wait()
			return failed(i, err)
		}
		obs.Attach(i, consumers[i])
	}
	if cfg.Console != nil {
		if err := serveConsole(gctx, g, cfg, consumers, log); err != nil {
			cancel()
			_ = g.Wait()
			return err
		}
	}
	if cfg.Kafka != nil {
		if err := serveKafka(gctx, g, cfg, log); err != nil {
			cancel()
			_ = g.Wait()
			return err
		}
	}
	var running sync.WaitGroup
	for i, c := range consumers {
		running.Add(1)
		g.Go(func() error {
			defer running.Done()
			return failed(i, c.Run(gctx))
		})
	}
	g.Go(func() error {
		// The consumers stopped: stop serving too.
		running.Wait()
		cancel()
		return nil
	})
	return g.Wait()
}
