// Package demo is `consumer demo` (in cmd/consumer-dev): producers append
// events for many hosts at a steady rate while a consumer group handles
// them (into a JSON file, or relayed to an in-process Kafka broker), on a
// PostgreSQL it starts itself unless DATABASE_URL names one, printing
// events/s, lag and latency every second; it stops by itself and checks
// that every committed event was handled.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/cmd/consumer-dev/internal/latency"
	"github.com/pgevents/pgevents/cmd/consumer/consumercli"
	"github.com/pgevents/pgevents/internal/pgcluster"
	"github.com/pgevents/pgevents/schema"
)

// demoCmd appends events for many hosts at a steady rate while a consumer
// group handles them with the log handler, printing progress every second,
// and stops by itself.
func demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := consumercli.NewFlagSet(ctx, "demo", "[--duration D] [--rate N] [--hosts N] [--partitions N] [--sink log|kafka] [--console ADDR] [--dir DIR]",
		"Appends events for many hosts at a steady rate while a consumer group handles them, printing progress every second, and serves the operator console; stops by itself. It starts a PostgreSQL under --dir unless DATABASE_URL is set.")
	dir := fs.String("dir", ".pgevents-demo", "folder for the local PostgreSQL and the handled events (git-ignored)")
	duration := fs.Duration("duration", 15*time.Second, "how long producers run")
	rate := fs.Int("rate", 2000, "events appended per second, in total")
	hosts := fs.Int("hosts", 200, "number of hosts (tenants)")
	partitions := fs.Int("partitions", 8, "partitions of the demo topic, when it is created")
	sinkName := fs.String("sink", "log", "where handled events go: log (a JSON file) or kafka (relayed to an in-process Kafka broker)")
	consoleAddr := fs.String("console", "127.0.0.1:0", "address of the operator console served while the demo runs (port 0: a free one); off: none")
	if err := consumercli.ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return consumercli.Usagef("demo: unexpected argument %q", fs.Arg(0))
	}
	if *sinkName != "log" && *sinkName != "kafka" {
		return consumercli.Usagef("demo: --sink must be log or kafka, got %q", *sinkName)
	}
	if *rate <= 0 || *hosts <= 0 || *partitions <= 0 || *duration <= 0 {
		return consumercli.Usagef("demo: --rate, --hosts, --partitions and --duration must be positive")
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		abs, err := filepath.Abs(filepath.Join(*dir, "pg"))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "starting PostgreSQL in %s ...\n", abs)
		// Relocate: as root, the server runs as the postgres user, who
		// often cannot enter the repository (a 0700 home).
		cl, err := pgcluster.Start(ctx, pgcluster.Options{Dir: abs, Relocate: true})
		if err != nil {
			return err
		}
		defer cl.Stop() //nolint:errcheck // best effort at exit
		if cl.Dir() != abs {
			fmt.Fprintf(stdout, "as root, PostgreSQL runs as the postgres user, who cannot reach %s:\n"+
				"the cluster is in %s instead (%s links to it; make clean removes both)\n", abs, cl.Dir(), abs)
		}
		url = cl.URL("postgres")
	}

	pc, err := pgevents.ParsePoolConfig(url)
	if err != nil {
		return err
	}
	pc.MaxConns = int32(*partitions + 16) // the consumer, the producers and the console
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := schema.Migrate(ctx, pool); err != nil {
		return err
	}
	const topicID = 1
	topic, _, err := schema.EnsureTopic(ctx, pool, topicID, *partitions)
	if err != nil {
		return err
	}

	eventsPath := filepath.Join(*dir, "events.jsonl")
	out, err := os.Create(eventsPath)
	if err != nil {
		return err
	}
	defer out.Close()

	lat := &latency.Recorder{}
	handler, handled := pgevents.LogHandler(out), "handled/s"
	var relay *demoKafka
	if *sinkName == "kafka" {
		if relay, err = startDemoKafka(stdout); err != nil {
			return err
		}
		defer relay.close()
		handler, handled = relay.sink, "relayed/s"
	}
	hs := &pgevents.Handlers{}
	hs.HandleAll(pgevents.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
		lat.Add(time.Since(ev.CreatedAt))
		return handler.Handle(ctx, tx, ev)
	}))
	log := zerolog.New(zerolog.ConsoleWriter{Out: stderr, TimeFormat: time.TimeOnly}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	c, err := pgevents.NewConsumer(pool, pgevents.Config{
		GroupID: "demo", TopicID: topicID, TotalPartitions: topic.Partitions,
		BatchSize: 100, WaitPeriod: 5 * time.Second, Handlers: hs, Logger: &log,
	})
	if err != nil {
		return err
	}

	dest := "handled events go to " + eventsPath
	if relay != nil {
		dest = "handled events are relayed to Kafka"
	}
	fmt.Fprintf(stdout, "topic %d: %d partitions; %d hosts; %d events/s for %s; %s\n",
		topicID, topic.Partitions, *hosts, *rate, *duration, dest)
	consumerCtx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	var cg errgroup.Group
	cg.Go(func() error { return c.Run(consumerCtx) })
	if *consoleAddr != "off" {
		if err := serveConsole(consumerCtx, &cg, pool, c, *consoleAddr, &log, stdout); err != nil {
			stopConsumer()
			_ = cg.Wait()
			return err
		}
	}

	var appended atomic.Int64
	prodCtx, stopProducers := context.WithTimeout(ctx, *duration)
	defer stopProducers()
	var pg errgroup.Group
	const producers = 4
	for i := range producers {
		pg.Go(func() error { return produce(ctx, prodCtx, pool, i, *rate/producers, *hosts, &appended) })
	}

	fmt.Fprintf(stdout, "%8s %12s %12s %8s %10s %10s\n", "elapsed", "appended/s", handled, "lag", "p50", "p99")
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastA, lastH int64
	var (
		drainDeadline time.Time
		produced      bool // the producers have finished their last transaction
	)
	for {
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		if prodCtx.Err() != nil && !produced {
			// Wait for the transactions under way, so that every commit
			// is counted before comparing.
			if err := pg.Wait(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				return err
			}
			produced = true
			drainDeadline = time.Now().Add(10 * time.Second)
		}
		a, h := appended.Load(), c.Stats().Handled
		p50, p99 := lat.Take()
		fmt.Fprintf(stdout, "%8s %12d %12d %8d %10s %10s\n", time.Since(start).Truncate(time.Second),
			a-lastA, h-lastH, a-h, fmtDur(p50), fmtDur(p99))
		lastA, lastH = a, h
		if ctx.Err() != nil || (produced && (a == h || time.Now().After(drainDeadline))) {
			break
		}
	}
	if !produced {
		_ = pg.Wait() // interrupted: the producers stop with ctx
	}
	stopConsumer()
	if err := cg.Wait(); err != nil {
		return err
	}
	st := c.Stats()
	fmt.Fprintf(stdout, "done: %d events appended, %d handled in %d batches, %d dead-lettered\n",
		appended.Load(), st.Handled, st.Batches, st.DeadLettered)
	if appended.Load() != st.Handled {
		return fmt.Errorf("demo: %d events appended but %d handled", appended.Load(), st.Handled)
	}
	if relay != nil {
		return relay.report(ctx, stdout)
	}
	return nil
}

// produce appends transactions of 1–10 events for random hosts at about
// rate events per second until until ends. Transactions run on ctx, so
// that none is cut short at the end and every commit is counted.
func produce(ctx, until context.Context, pool *pgxpool.Pool, id, rate, hosts int, appended *atomic.Int64) error {
	rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
	start := time.Now()
	var sent int64
	for until.Err() == nil {
		// Pace: sleep until the schedule allows the next transaction.
		due := start.Add(time.Duration(float64(sent) / float64(rate) * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			select {
			case <-until.Done():
				return nil
			case <-time.After(d):
			}
		}
		n := 1 + rng.IntN(10)
		evs := make([]pgevents.Event, n)
		host := fmt.Sprintf("host-%d", rng.IntN(hosts))
		user := fmt.Sprintf("user-%d", rng.IntN(5))
		for i := range evs {
			evs[i] = pgevents.Event{HostID: host, UserID: user, EventType: "demo.updated",
				Payload: []byte(fmt.Sprintf(`{"seq":%d,"producer":%d}`, sent+int64(i), id))}
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := pgevents.Append(ctx, tx, evs...)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		sent += int64(n)
		appended.Add(int64(n))
	}
	return nil
}

func fmtDur(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000)
}

// Command is `consumer-dev demo`.
var Command = consumercli.Command{Name: "demo", Run: demoCmd}
