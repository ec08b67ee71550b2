package consumercli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/schema"
)

// consolePoolSize is the console's own pool: its pages read a few
// statements at a time, and an action holds one transaction.
const consolePoolSize = 4

// consoleAbout is what `consumer console -h` prints before the flags.
const consoleAbout = `Serves the operator console (see package console), without consumers:
pages on the log, the groups, dead letters, hosts and replicas, and, with
the token, actions (pause, resume, reset, unhalt, replay, discard). The
file's console section configures it (listen, token, readOnly,
pagesNeedToken, allowedHosts, trustedProxies; PGEVENTS_CONSOLE_TOKEN
replaces the token); replay and discard run the
handlers of the file's groups.
`

// consoleCmd is `consumer console`: the console alone, apart from the
// consumers.
func (c *CLI) consoleCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "console", "[--config FILE] [--listen HOST:PORT]", consoleAbout)
	path := fs.String("config", defaultConfigPath, "configuration file: the database, the console section and the groups whose handlers replay dead letters")
	listen := fs.String("listen", "", "address to listen on (default: the file's console.listen)")
	addr := fs.String("addr", "", "deprecated: the old name of --listen")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if *addr != "" {
		if *listen != "" && *listen != *addr {
			return usagef("console: --addr is the old name of --listen: give one of them")
		}
		fmt.Fprintln(stderr, "consumer console: --addr is deprecated: name it --listen")
		*listen = *addr
	}
	if fs.NArg() != 0 {
		return usagef("console: unexpected argument %q", fs.Arg(0))
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	if *listen != "" {
		if cfg.Console == nil {
			cfg.Console = &config.Console{}
			cfg.Console.Token = os.Getenv(config.EnvConsoleToken)
		}
		cfg.Console.Listen = *listen
		if err := cfg.Validate(); err != nil {
			var ce *config.Error
			if errors.As(err, &ce) {
				ce.File = *path
			}
			return err
		}
	}
	if cfg.Console == nil {
		return &config.Error{File: *path, Key: "console.listen",
			Msg: "the file has no console section: add `console: {listen: 127.0.0.1:8080, token: ...}`, or give --listen"}
	}
	if err := cfg.ConsoleError(); err != nil {
		return inFile(err, *path)
	}
	log := newLogger(cfg, stderr)
	logWarnings(cfg, &log)
	pool, err := openConsolePool(ctx, cfg, *path)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := installed(schema.WithName(ctx, cfg.Schema), pool, "schema", *path); err != nil {
		return err
	}
	// The groups' handlers, for replay and discard: consumers that never
	// run. The console shows the top level's database and schema: a group
	// on another has no dead letters here.
	groups := cfg.GroupConfigs()
	consumers := make([]*pgevents.Consumer, len(groups))
	for i, g := range groups {
		if !cfg.SameInstallation(i) {
			log.Info().Str("group", g.GroupID).Msg("console: the group runs on another database or schema than the console's (the top level's): not shown here")
			continue
		}
		handlers, closeHandlers, err := c.buildHandlers(cfg, i, stdout)
		if err != nil {
			log.Warn().Err(err).Str("group", g.GroupID).Msg("console: no handlers for the group: its dead letters cannot be replayed here")
			continue
		}
		defer closeHandlers()
		if consumers[i], err = pgevents.NewConsumer(pool, g.Consumer(handlers, &log)); err != nil {
			return inFile(cfg.ConsumerError(i, err), *path)
		}
	}
	var g errgroup.Group
	if err := startConsole(ctx, &g, cfg, pool, consumers, &log, stdout); err != nil {
		return err
	}
	return g.Wait()
}

// startConsole listens on the configured console's address (so that a
// busy address fails before anything else starts) and serves in g until
// ctx ends. consumers are the file's groups, in GroupConfigs order (nil
// for a group without handlers), whose handlers replay dead letters: those
// of the console's database and schema (the top level's) only, since a
// dead letter is found by its id in the console's.
func startConsole(ctx context.Context, g *errgroup.Group, cfg *config.Config, pool *pgxpool.Pool,
	consumers []*pgevents.Consumer, log *zerolog.Logger, stdout io.Writer) error {
	groups := cfg.GroupConfigs()
	resolvers := map[string]console.Resolver{}
	for i, c := range consumers {
		if c != nil && i < len(groups) && cfg.SameInstallation(i) {
			resolvers[fmt.Sprintf("%d/%s", groups[i].TopicID, groups[i].GroupID)] = c
		}
	}
	c, err := console.New(pool, console.Options{
		Schema:         cfg.Schema,
		Token:          cfg.Console.Token,
		ReadOnly:       cfg.Console.ReadOnly,
		PagesNeedToken: cfg.Console.PagesNeedToken,
		Addr:           cfg.Console.Listen,
		AllowedHosts:   cfg.Console.AllowedHosts,
		TrustedProxies: cfg.Console.TrustedProxies,
		Logger:         log,
		Resolvers: func(group string, topic int) console.Resolver {
			return resolvers[fmt.Sprintf("%d/%s", topic, group)]
		},
	})
	if err != nil {
		return err
	}
	srv, err := console.Listen(cfg.Console.Listen, c)
	if err != nil {
		return fmt.Errorf("console.listen %s: %w", cfg.Console.Listen, err)
	}
	log.Info().Str("addr", srv.Addr()).Bool("read_only", cfg.Console.ReadOnly).Msg("console listening")
	fmt.Fprintf(stdout, "console: %s\n", srv.URL())
	g.Go(func() error { return srv.Run(ctx) })
	return nil
}

// openConsolePool connects the console to the configured database, with
// the same URL rules as the consumers (DATABASE_URL, the file's session
// timeouts), on a small pool of its own.
func openConsolePool(ctx context.Context, cfg *config.Config, path string) (*pgxpool.Pool, error) {
	return openPoolOn(ctx, cfg, cfg.DatabaseURL, "databaseUrl", consolePoolSize, path)
}

// serveConsole is the console of `consumer run` (the file has a console
// section): on a pool of its own, closed when ctx ends, replaying dead
// letters with the running consumers.
func serveConsole(ctx context.Context, g *errgroup.Group, cfg *config.Config, consumers []*pgevents.Consumer, log *zerolog.Logger) error {
	pool, err := openConsolePool(ctx, cfg, "")
	if err != nil {
		return err
	}
	if log == nil {
		nop := zerolog.Nop()
		log = &nop
	}
	if err := startConsole(ctx, g, cfg, pool, consumers, log, io.Discard); err != nil {
		pool.Close()
		return err
	}
	g.Go(func() error {
		<-ctx.Done()
		pool.Close()
		return nil
	})
	return nil
}

// logWarnings logs what the configuration file says that is read but
// should be said otherwise (a deprecated key), one line each, naming the
// key.
func logWarnings(cfg *config.Config, log *zerolog.Logger) {
	for _, w := range cfg.Warnings() {
		log.Warn().Str("key", w.Key).Int("line", w.Line).Msg(w.String())
	}
}
