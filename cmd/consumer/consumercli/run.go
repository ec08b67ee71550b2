package consumercli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/schema"
)

const defaultConfigPath = "db-event-consumer.yml"

// runCmd is `consumer run`: every group of the file, with the built-in
// handlers it configures and the Go handlers it names, until ctx ends.
// Everything the file says is checked before the database is reached: a
// group's pgevents.Config (pgevents.Config.Validate), the Go handlers it
// names, the console's token when the file has a console section, and the
// Kafka endpoint's passwords and TLS files when it has a kafka section.
func (c *CLI) runCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "run", "[--config FILE]",
		"Runs the configured groups until SIGINT or SIGTERM, with their built-in and Go handlers, the relays, the metrics and health server, and the console and the Kafka endpoint when the file has their sections.")
	path := fs.String("config", defaultConfigPath, "configuration file")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("run: unexpected argument %q", fs.Arg(0))
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	if err := cfg.ConsoleError(); err != nil {
		return inFile(err, *path)
	}
	if err := cfg.KafkaError(); err != nil {
		return inFile(err, *path)
	}
	log := newLogger(cfg, stderr)
	logWarnings(cfg, &log)

	// One consumer per group, all on the pool, stopped together.
	groups := cfg.GroupConfigs()
	ccfgs := make([]pgevents.Config, len(groups))
	for i := range groups {
		handlers, closeHandlers, err := c.buildHandlers(cfg, i, stdout)
		if err != nil {
			return inFile(err, *path)
		}
		defer closeHandlers()
		ccfgs[i] = groups[i].Consumer(handlers, &log)
		if err := ccfgs[i].Validate(); err != nil {
			return inFile(cfg.ConsumerError(i, err), *path)
		}
	}
	tp, shutdownTracing, err := c.tracerProvider(ctx, cfg, *path)
	if err != nil {
		return err
	}
	defer shutdownTracing(&log)
	for i := range ccfgs {
		ccfgs[i].TracerProvider = tp
	}
	// A pool per database, sized for the groups on it.
	// A database that cannot take the process yet (connection slots,
	// start-up) is waited for.
	pools, closePools, err := openPoolsWaiting(ctx, cfg, *path, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for the database
		}
		return err
	}
	defer closePools()
	if err := checkStatements(ctx, cfg, pools, *path); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil // stopped (SIGTERM, Ctrl-C) before any consumer started
	}
	ctx = schema.WithName(ctx, cfg.Schema)
	return groupError(cfg, runConsumers(ctx, cfg, pools, ccfgs), *path)
}

// checkStatements prepares the statement of each handler of type sql of
// cfg's groups (but those with prepareAtStart: false) on the group's pool
// (pools, in GroupConfigs order), before any consumer starts: a statement
// the server cannot prepare (a missing table or column, $1, a parameter
// a sql handler does not bind) is a configuration error naming its key,
// with the server's message, rather than a batch retried for ever. What
// is not the statement's fault is not a configuration error: a session
// that could not be had or was lost while preparing (the server gone, the
// network cut) is an error of its own, and a stop (ctx ended: SIGTERM
// while starting) returns nil, the caller seeing ctx's end.
func checkStatements(ctx context.Context, cfg *config.Config, pools []*pgxpool.Pool, path string) error {
	for g, group := range cfg.GroupConfigs() {
		for i, h := range group.Handlers {
			if h.Type != "sql" || !h.PreparesAtStart() {
				continue
			}
			var checked, lost bool
			err := pools[g].AcquireFunc(ctx, func(c *pgxpool.Conn) error {
				err := pgevents.CheckSQLHandler(ctx, c.Conn(), h.Statement)
				checked, lost = true, err != nil && c.Conn().IsClosed()
				return err
			})
			if err != nil && ctx.Err() != nil {
				return nil
			}
			var pgErr *pgconn.PgError
			if err != nil && (!checked || lost || errors.As(err, &pgErr) && !strings.HasPrefix(pgErr.Code, "42")) {
				return fmt.Errorf("group %s: handlers[%d]: %w", group.GroupID, i, err) // not the statement's fault
			}
			if err != nil {
				msg := strings.TrimPrefix(err.Error(), "sql handler: ")
				if pgErr != nil && pgErr.Code == "42P01" {
					msg += "; if the table is created after the consumer starts, set prepareAtStart: false on the handler"
				}
				return &config.Error{File: path, Key: cfg.KeyPath(g, fmt.Sprintf("handlers[%d].statement", i)),
					Msg: "cannot be prepared: " + msg}
			}
		}
	}
	return nil
}

// inFile returns err with path as the File of the *config.Error in it.
func inFile(err error, path string) error {
	var ce *config.Error
	if errors.As(err, &ce) && ce.File == "" {
		ce.File = path
	}
	return err
}

// groupError names the configuration key behind a consumer's refusal to
// start: the key of the group that refused (a *groupFailure), or of the
// top level when the error does not say which.
func groupError(cfg *config.Config, err error, path string) error {
	group := -1
	var gf *groupFailure
	if errors.As(err, &gf) {
		group = gf.group
	}
	key := func(k string) string {
		if group < 0 {
			return k
		}
		return cfg.KeyPath(group, k)
	}
	var mismatch *pgevents.PartitionMismatchError
	if errors.As(err, &mismatch) {
		return &config.Error{File: path, Key: key("totalPartitions"), Msg: mismatch.Error()}
	}
	var channel *pgevents.ChannelMismatchError
	if errors.As(err, &channel) {
		return &config.Error{File: path, Key: key("channel"), Msg: channel.Error()}
	}
	var inUse *pgevents.GroupInUseError
	if errors.As(err, &inUse) {
		return &config.Error{File: path, Key: key("groupId"),
			Msg: fmt.Sprintf("%v; a group's name belongs to one kind of consumer at a time: stop them, or choose another groupId", inUse)}
	}
	var timeouts *pgevents.TimeoutError
	if errors.As(err, &timeouts) {
		return &config.Error{File: path, Key: key("handlerTimeoutMs"), Msg: timeouts.Error()}
	}
	if errors.Is(err, schema.ErrTopicNotFound) {
		return &config.Error{File: path, Key: key("topicId"),
			Msg: fmt.Sprintf("%v; create it with `consumer migrate --config %s`", err, path)}
	}
	return err
}

// groupFailure is the error of one group of a process that runs several:
// its index in the file's groups (GroupConfigs order), its id and what
// went wrong.
type groupFailure struct {
	group int
	id    string
	err   error
}

func (e *groupFailure) Error() string { return fmt.Sprintf("group %s: %v", e.id, e.err) }
func (e *groupFailure) Unwrap() error { return e.err }

// connect loads the configuration file at path and opens a pool on its
// top-level database, the one of the commands that name no group; when
// topic points to 0, it is set to the configuration's topicId. The
// context it returns names the configured schema (every statement run
// with it finds pgevents there).
func connect(ctx context.Context, path string, topic *int) (context.Context, *config.Config, *pgxpool.Pool, error) {
	return connectTop(ctx, path, topic, true)
}

// connectTop is connect; installed false leaves out the check that
// pgevents is installed, for the commands that install it (adopt).
func connectTop(ctx context.Context, path string, topic *int, installed bool) (context.Context, *config.Config, *pgxpool.Pool, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return ctx, nil, nil, err
	}
	if topic != nil && *topic == 0 {
		*topic = cfg.TopicID
	}
	open := topPlace(cfg).open
	if !installed {
		open = topPlace(cfg).openRaw
	}
	ctx, pool, err := open(ctx, cfg, cfg.PoolSize(), path)
	if err != nil {
		return ctx, nil, nil, err
	}
	return ctx, cfg, pool, nil
}

// buildHandlers creates the handlers group g of cfg configures: the
// built-in ones, and the Go handlers of c its handlers of type go name. A
// name nobody registered is a configuration error naming the key.
func (c *CLI) buildHandlers(cfg *config.Config, g int, stdout io.Writer) (*pgevents.Handlers, func(), error) {
	group := cfg.GroupConfigs()[g]
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
	keyErr := func(i int, key, msg string) error {
		closeAll()
		return &config.Error{Key: cfg.KeyPath(g, fmt.Sprintf("handlers[%d].%s", i, key)), Msg: msg}
	}
	for i, h := range group.Handlers {
		var handler pgevents.Handler
		switch h.Type {
		case "sql":
			handler = pgevents.SQLHandler(group.GroupID, h.Statement)
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
					return nil, nil, keyErr(i, "output", err.Error())
				}
				files = append(files, f)
				out = f
			}
			handler = pgevents.LogHandler(out)
		case "go":
			handler = c.Handlers[h.Name]
			if handler == nil {
				return nil, nil, keyErr(i, "name", c.unregistered(h.Name))
			}
		case "kafka", "http":
			s, closeSink, err := buildSink(cfg, g, i, &h)
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			sinks = append(sinks, closeSink)
			handler = s
		}
		hs.Handle(h.EventType, handler)
	}
	return hs, closeAll, nil
}

// goHandlersError returns a configuration error naming the first handler
// of type go of cfg's groups whose name c does not have (handlers[i].name),
// or nil: what run and dlq find when they build the handlers, for the
// commands that build none (migrate).
func (c *CLI) goHandlersError(cfg *config.Config) error {
	for g, group := range cfg.GroupConfigs() {
		for i, h := range group.Handlers {
			if h.Type == "go" && c.Handlers[h.Name] == nil {
				return &config.Error{Key: cfg.KeyPath(g, fmt.Sprintf("handlers[%d].name", i)), Msg: c.unregistered(h.Name)}
			}
		}
	}
	return nil
}

// unregistered says that no Go handler is registered as name, and which
// are.
func (c *CLI) unregistered(name string) string {
	var names []string
	for n, h := range c.Handlers {
		if h != nil {
			names = append(names, strconv.Quote(n))
		}
	}
	if len(names) == 0 {
		return fmt.Sprintf("no Go handler is registered as %q: this binary has none (a service registers its own in consumercli.CLI.Handlers)", name)
	}
	slices.Sort(names)
	return fmt.Sprintf("no Go handler is registered as %q (registered: %s)", name, strings.Join(names, ", "))
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
