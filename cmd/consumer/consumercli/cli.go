// Package consumercli is the consumer command: its subcommands (run,
// migrate, status, dlq, offsets, group, repartition, maintain, adopt,
// console, kafka, version), the exit statuses and the configuration errors that name a
// key. It is the whole of the production binary, cmd/consumer, whose main
// is one call, and it is public so that a service builds the same binary
// around its own Go handlers.
//
// # A service's own consumer binary
//
// A service whose handlers are written in Go registers them by name in a
// CLI and runs it as its main:
//
//	func main() {
//		(&consumercli.CLI{Handlers: consumercli.Handlers{
//			"invoices": invoices.Handler(pool),
//			"search":   pgevents.JSONHandler(indexUser),
//		}}).Execute()
//	}
//
// The binary has every command of the stock one, configured by the same
// db-event-consumer.yml, and its handlers of type go bind a registered
// handler to event types, beside the built-in types (log, sql, kafka,
// http):
//
//	handlers:
//	  - eventType: invoice.paid
//	    type: go
//	    name: invoices          # as registered in CLI.Handlers
//	  - eventType: "*"
//	    type: log
//
// So `run` runs several groups from one file, each with Go and built-in
// handlers, with the relays, the metrics and health endpoints, graceful
// shutdown on SIGINT or SIGTERM and the exit statuses below; `dlq replay`
// runs the group's Go handlers too; `migrate`, `status`, `offsets`,
// `group` and the others work as in the stock binary. A file that names a
// Go handler the binary does not have is refused before anything runs, by
// run and migrate: exit status 2, naming the key (handlers[0].name).
//
// The usage, the messages and `version` call the binary by its file name
// (or CLI.Name). The operator commands (group pause, resume, cancel and
// unhalt, offsets reset, dlq replay and discard) are recorded in the console's
// audit with origin cli and the operating system's user@host as actor
// (offsets.Audit); pause and resume are idempotent.
//
// # Development commands
//
// The development commands, demo and bench, live in a binary of their own,
// cmd/consumer-dev, which is this command plus them, and in packages under
// it (cmd/consumer-dev/internal/demo, cmd/consumer-dev/internal/bench) that
// no other command can import: they start throwaway PostgreSQL clusters and
// in-process Kafka brokers, which have no place in what runs in production.
// The production binary hands them to consumer-dev (see Delegate).
//
// # Usage
//
//	consumer run     [--config FILE]   run the configured groups until SIGINT/SIGTERM
//	consumer migrate [--config FILE] [--print]
//	                                   apply the schema and create the configured topic
//	consumer dlq     list|replay|discard  dead-letter admin
//	consumer offsets show [--group G] [--json]  positions, log ends and lags
//	consumer offsets reset --group G --to earliest|latest|offset:N|time:T [--force]
//	consumer group   pause|resume|cancel G
//	consumer group   unhalt G --partition N
//	consumer status  [--config FILE] [--group G] [--json] [--watch [--interval D]]
//	consumer repartition --partitions N [--topic T]  change the partition count online
//	consumer maintain [--once]       segments, dead groups, retention and sequencers without a consumer
//	consumer adopt   [--partitions N] [--dry-run|--print] [--bridge] | --unbridge
//	                                   move a seed-style deployment onto pgevents
//	consumer console [--config FILE] [--listen HOST:PORT]
//	                                   the operator console, without consumers
//	consumer kafka   [--config FILE] [--listen HOST:PORT]
//	                                   the Kafka protocol endpoint, without consumers
//	consumer demo    [--duration D]    producers and a consumer on a local PostgreSQL (consumer-dev)
//	consumer bench   [--quick] [--only CASES] [--json]  the benchmark table (consumer-dev)
//	consumer version                   the module version and the commit built
//
// The configuration file defaults to db-event-consumer.yml; DATABASE_URL
// overrides its databaseUrl. Exit status: 0 on success (and after a clean
// shutdown), 1 on a runtime failure, 2 on invalid configuration or usage,
// with the offending key named.
package consumercli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"go.opentelemetry.io/otel/trace"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError is a command-line or configuration error: exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// Usage wraps err as a command-line error: the command exits with status 2.
func Usage(err error) error { return &usageError{err} }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// Usagef is Usage of a formatted error.
func Usagef(format string, args ...any) error { return usagef(format, args...) }

// nameKey is the context key of the command's name.
type nameKey struct{}

// cmdName returns the command's name that Main put in ctx: what usage and
// messages call the binary.
func cmdName(ctx context.Context) string {
	if n, ok := ctx.Value(nameKey{}).(string); ok {
		return n
	}
	return "consumer"
}

// named returns s with each {cmd} replaced by the command's name.
func named(ctx context.Context, s string) string {
	return strings.ReplaceAll(s, "{cmd}", cmdName(ctx))
}

const usage = `usage: {cmd} <command> [flags]

commands:
  run      run the configured consumer groups until SIGINT or SIGTERM
  migrate  apply the schema migrations and create the configured topic
  dlq      list, replay or discard dead letters (consumer dlq -h)
  offsets show [--group G] [--json]
           each group's position, log end and lag per partition
  offsets reset --group G --to earliest|latest|offset:N|time:T [--force]
           move a group's positions (replay or skip)
  group pause|resume|cancel G
           change a group's subscription state
  group unhalt G --partition N
           unhalt a halted partition: its consumer tries the failed unit again
  status   each group's position, owner, lag, dead letters and halts per partition
  repartition --partitions N [--topic T]
           change a topic's partition count online
  maintain [--once]
           create segments, sweep dead groups, apply retention, sequence sequenced topics (where no consumer runs)
  adopt    [--partitions N] [--dry-run | --print] [--bridge] | --unbridge
           move a seed-style deployment (its log and every group's position) onto pgevents
  console  [--listen HOST:PORT]
           serve the operator console (the file's console section), without consumers
  kafka    [--listen HOST:PORT]
           serve the Kafka protocol (the file's kafka section) to Kafka clients, without consumers
  demo     run producers and a consumer group against a local PostgreSQL (consumer-dev)
  bench    [--quick] [--only CASES] [--json]  the benchmark table, BENCHMARKS.md (consumer-dev)
  version  print the module version and the commit the binary was built from

Run '{cmd} <command> -h' for a command's flags.
`

// Command is a subcommand beyond the built-in ones, given to Main.
type Command struct {
	// Name is the word that selects it: consumer <Name> [flags].
	Name string
	// Run runs it with the arguments after its name.
	Run func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// Handlers are Go handlers by name: the names that the file's handlers of
// type go give (name: invoices).
type Handlers map[string]pgevents.Handler

// CLI is the consumer command with what a binary adds to the built-in
// subcommands: the Go handlers its configuration files may name, and more
// commands. The zero CLI is the stock binary without demo and bench.
type CLI struct {
	// Name is what the usage and the messages call the binary. Defaults
	// to the running binary's file name (filepath.Base(os.Args[0])), so a
	// service's own binary, built with its Go handlers, calls itself by its
	// own name.
	Name string
	// Handlers are the Go handlers a handlers item of type go names. A
	// name the file gives that is not here (or is nil) is a configuration
	// error: exit status 2, naming the key. A registered handler may serve
	// several groups and event types: it is called concurrently, from every
	// partition's worker.
	Handlers Handlers
	// Commands are subcommands beyond the built-in ones (consumer-dev adds
	// demo and bench).
	Commands []Command
	// TracerProvider, when set, traces the consumers of `run` (their
	// pgevents.Config.TracerProvider) and wins over the file's tracing
	// section: a service's binary that sets up OpenTelemetry itself gives
	// its provider here, and flushes and shuts it down itself. Nil: the
	// file's tracing section, or no tracing.
	TracerProvider trace.TracerProvider
}

// Execute is the whole main function of a consumer binary: it runs the
// process's command line (os.Args) until SIGINT or SIGTERM, which stop
// `run` gracefully (the in-flight batches commit or roll back, leases are
// handed over), and exits with the command's status.
func (c *CLI) Execute() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := c.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Main runs the command line args (without the program name) until ctx
// ends, and returns the process exit status: 0 on success (and after a
// clean shutdown), 1 on a runtime failure, 2 on invalid configuration or
// usage.
func (c *CLI) Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := c.name()
	ctx = context.WithValue(ctx, nameKey{}, name)
	if len(args) == 0 {
		fmt.Fprint(stderr, named(ctx, usage))
		return exitUsage
	}
	var err error
	switch args[0] {
	case "run":
		err = c.runCmd(ctx, args[1:], stdout, stderr)
		if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// Asked to stop (SIGINT, SIGTERM) before it had started:
			// a shutdown, not a failure.
			err = nil
		}
	case "migrate":
		err = c.migrateCmd(ctx, args[1:], stdout, stderr)
	case "dlq":
		err = c.dlqCmd(ctx, args[1:], stdout, stderr)
	case "offsets":
		err = offsetsCmd(ctx, args[1:], stdout, stderr)
	case "group":
		err = groupCmd(ctx, args[1:], stdout, stderr)
	case "status":
		err = statusCmd(ctx, args[1:], stdout, stderr)
	case "repartition":
		err = repartitionCmd(ctx, args[1:], stdout, stderr)
	case "maintain":
		err = maintainCmd(ctx, args[1:], stdout, stderr)
	case "adopt":
		err = adoptCmd(ctx, args[1:], stdout, stderr)
	case "console":
		err = c.consoleCmd(ctx, args[1:], stdout, stderr)
	case "kafka":
		err = kafkaCmd(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		err = versionCmd(name, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, named(ctx, usage))
		return exitOK
	default:
		i := slices.IndexFunc(c.Commands, func(cmd Command) bool { return cmd.Name == args[0] })
		if i < 0 {
			fmt.Fprintf(stderr, "%s: unknown command %q\n%s", name, args[0], named(ctx, usage))
			return exitUsage
		}
		err = c.Commands[i].Run(ctx, args[1:], stdout, stderr)
	}
	return exitCode(name, err, stderr)
}

// name returns c.Name, or the running binary's file name.
func (c *CLI) name() string {
	if c.Name != "" {
		return c.Name
	}
	if len(os.Args) > 0 && os.Args[0] != "" {
		return filepath.Base(os.Args[0])
	}
	return "consumer"
}

// Main runs the command line args (without the program name) of the stock
// binary with the extra commands until ctx ends, and returns the process
// exit status: (&CLI{Commands: extra}).Main.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, extra ...Command) int {
	return (&CLI{Commands: extra}).Main(ctx, args, stdout, stderr)
}

func exitCode(name string, err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var status *exitStatus
	if errors.As(err, &status) {
		return status.code // a delegated command's, which said why itself
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	var ue *usageError
	var ce *config.Error
	if errors.As(err, &ue) || errors.As(err, &ce) {
		return exitUsage
	}
	return exitFailure
}
