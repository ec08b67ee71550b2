package consumercli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/kafka"
)

// kafkaPoolSize is the Kafka endpoint's own pool: a session that holds the
// topics' follow keys, and the requests' statements (each a few
// statements, or one transaction for a produce; a fetch reads four
// partitions at once).
const kafkaPoolSize = 16

// kafkaAbout is what `consumer kafka -h` prints before the flags.
const kafkaAbout = `Serves the Kafka protocol over the database (see package kafka), without
consumers: Kafka clients (kcat, franz-go, librdkafka, the Java client)
read the topics the file's kafka section names, produce events to them,
and commit offsets as pgevents groups. The section configures it (topics,
listen, advertisedAddr, readOnly, users, tls, nodeId, maxRequestBytes,
maxWaitMs, requestTimeoutMs); it serves the top level's database and
schema.
`

// kafkaCmd is `consumer kafka`: the Kafka endpoint alone, apart from the
// consumers.
func kafkaCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "kafka", "[--config FILE] [--listen HOST:PORT]", kafkaAbout)
	path := fs.String("config", defaultConfigPath, "configuration file: the database and the kafka section")
	listen := fs.String("listen", "", "address to listen on (default: the file's kafka.listen)")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("kafka: unexpected argument %q", fs.Arg(0))
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	if cfg.Kafka == nil {
		return &config.Error{File: *path, Key: "kafka",
			Msg: "the file has no kafka section: add `kafka: {topics: {events: 1}}` (Kafka topic name: pgevents topic id)"}
	}
	if *listen != "" {
		cfg.Kafka.Listen = *listen
		if err := cfg.Validate(); err != nil {
			var ce *config.Error
			if errors.As(err, &ce) {
				ce.File = *path
			}
			return err
		}
	}
	opts, err := cfg.KafkaOptions()
	if err != nil {
		return inFile(err, *path)
	}
	log := newLogger(cfg, stderr)
	ctx, pool, err := topPlace(cfg).open(ctx, cfg, kafkaPoolSize, *path)
	if err != nil {
		return err
	}
	defer pool.Close()
	var g errgroup.Group
	if err := startKafka(ctx, &g, opts, pool, &log); err != nil {
		return err
	}
	return g.Wait()
}

// startKafka listens on the endpoint's address (so that a busy address
// fails before anything else starts) and serves in g until ctx ends, on
// pool, whose schema ctx names. The server logs a line with its listen and
// advertised addresses when it starts.
func startKafka(ctx context.Context, g *errgroup.Group, opts kafka.Options, pool *pgxpool.Pool, log *zerolog.Logger) error {
	opts.Logger = log
	srv, err := kafka.New(pool, opts)
	if err != nil {
		return usagef("kafka: %w", err) // the file's rules are the options' own: not reached
	}
	if err := srv.Listen(); err != nil {
		return fmt.Errorf("kafka.listen %s: %w", opts.Listen, err)
	}
	if len(opts.Users) > 0 && opts.TLS == nil {
		log.Warn().Msg("kafka: users without tls: the clients' passwords travel in clear")
	}
	g.Go(func() error { return srv.Run(ctx) })
	return nil
}

// serveKafka is the Kafka endpoint of `consumer run` (the file has a kafka
// section): on a pool of its own on the top level's database, closed once
// the endpoint has stopped, which it does when ctx ends. ctx names the top
// level's schema.
func serveKafka(ctx context.Context, g *errgroup.Group, cfg *config.Config, log *zerolog.Logger) error {
	opts, err := cfg.KafkaOptions()
	if err != nil {
		return err
	}
	pool, err := openPoolOn(ctx, cfg, cfg.DatabaseURL, "databaseUrl", kafkaPoolSize, "")
	if err != nil {
		return err
	}
	if log == nil {
		nop := zerolog.Nop()
		log = &nop
	}
	var served errgroup.Group
	if err := startKafka(ctx, &served, opts, pool, log); err != nil {
		pool.Close()
		return err
	}
	g.Go(func() error {
		defer pool.Close()
		return served.Wait()
	})
	return nil
}
