package consumercli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/schema"
)

const defaultConfigPath = "db-event-consumer.yml"

func runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", defaultConfigPath, "configuration file")
	if err := fs.Parse(args); err != nil {
		return &usageError{err}
	}
	ctx, cfg, pool, err := connect(ctx, *path, nil)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	defer pool.Close()

	// One consumer per group, all on the pool, stopped together.
	groups := cfg.GroupConfigs()
	ccfgs := make([]pgevents.Config, len(groups))
	for i := range groups {
		handlers, closeHandlers, err := buildHandlers(&groups[i], stdout)
		if err != nil {
			return err
		}
		defer closeHandlers()
		ccfgs[i] = groups[i].Consumer(handlers, &log)
	}
	return groupError(runConsumers(ctx, cfg, pool, ccfgs), *path)
}

// groupError names the configuration key behind a consumer's refusal to
// start.
func groupError(err error, path string) error {
	var mismatch *pgevents.PartitionMismatchError
	if errors.As(err, &mismatch) {
		return &config.Error{File: path, Key: "totalPartitions", Msg: mismatch.Error()}
	}
	var channel *pgevents.ChannelMismatchError
	if errors.As(err, &channel) {
		return &config.Error{File: path, Key: "channel", Msg: channel.Error()}
	}
	var timeouts *pgevents.TimeoutError
	if errors.As(err, &timeouts) {
		return &config.Error{File: path, Key: "handlerTimeoutMs", Msg: timeouts.Error()}
	}
	if errors.Is(err, schema.ErrTopicNotFound) {
		return &config.Error{File: path, Key: "topicId",
			Msg: fmt.Sprintf("%v; create it with `consumer migrate --config %s`", err, path)}
	}
	return err
}

// connect loads the configuration file at path and opens a pool on its
// database; when topic points to 0, it is set to the configuration's
// topicId. The context it returns names the configured schema (every
// statement run with it finds pgevents there).
func connect(ctx context.Context, path string, topic *int) (context.Context, *config.Config, *pgxpool.Pool, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return ctx, nil, nil, err
	}
	if topic != nil && *topic == 0 {
		*topic = cfg.TopicID
	}
	pool, err := openPool(ctx, cfg, path)
	if err != nil {
		return ctx, nil, nil, err
	}
	return schema.WithName(ctx, cfg.Schema), cfg, pool, nil
}

// openPool connects to the configured database with the file's session
// timeouts and room for every group's consumer (Config.PoolSize).
func openPool(ctx context.Context, cfg *config.Config, path string) (*pgxpool.Pool, error) {
	pc, err := pgevents.NewPoolConfig(cfg.DatabaseURL, cfg.PoolOptions())
	if err != nil {
		return nil, &config.Error{File: path, Key: "databaseUrl", Msg: err.Error()}
	}
	pc.MaxConns = int32(cfg.PoolSize())
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(cctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return pool, nil
}

// buildHandlers creates the built-in handlers the file configures.
func buildHandlers(cfg *config.Config, stdout io.Writer) (*pgevents.Handlers, func(), error) {
	hs := &pgevents.Handlers{}
	var files []*os.File
	var sinks []func()
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
		for _, closeSink := range sinks {
			closeSink()
		}
	}
	for i, h := range cfg.Handlers {
		var handler pgevents.Handler
		switch h.Type {
		case "sql":
			handler = pgevents.SQLHandler(cfg.GroupID, h.Statement)
		case "log":
			var out io.Writer
			switch h.Output {
			case "", "stdout":
				out = stdout
			case "stderr":
				out = os.Stderr
			default:
				f, err := os.OpenFile(h.Output, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
				if err != nil {
					closeAll()
					return nil, nil, &config.Error{Key: fmt.Sprintf("handlers[%d].output", i), Msg: err.Error()}
				}
				files = append(files, f)
				out = f
			}
			handler = pgevents.LogHandler(out)
		case "kafka", "http":
			s, closeSink, err := buildSink(cfg, i, &h)
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			sinks = append(sinks, closeSink)
			handler = s
		}
		if h.EventType == "*" {
			hs.HandleAll(handler)
		} else {
			hs.Handle(h.EventType, handler)
		}
	}
	if hs.Len() == 0 {
		closeAll()
		return nil, nil, &config.Error{Key: "handlers", Msg: "at least one handler is required"}
	}
	return hs, closeAll, nil
}

// newLogger builds the process logger: JSON, or human-readable console
// output when logFormat says so or, with "auto", when stderr is a terminal.
func newLogger(cfg *config.Config, w io.Writer) zerolog.Logger {
	level, err := zerolog.ParseLevel(cfg.LogLevel)
	if err != nil {
		level = zerolog.InfoLevel
	}
	console := cfg.LogFormat == "console"
	if cfg.LogFormat == "auto" {
		if f, ok := w.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				console = true
			}
		}
	}
	if console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}
