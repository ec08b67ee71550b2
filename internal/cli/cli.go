// Package cli is the consumer command: its subcommands (run, migrate,
// status, dlq, offsets, group, repartition, maintain, adopt, version), the
// exit statuses and the configuration errors that name a key. It is the
// whole of the production binary, cmd/consumer, whose main is one call to
// Main.
//
// The development commands, demo and bench, live in packages of their own
// (internal/demo, internal/bench) and in a binary of their own,
// cmd/consumer-dev, which is this command plus them: they start throwaway
// PostgreSQL clusters and in-process Kafka brokers, which have no place in
// what runs in production. The production binary hands them to
// consumer-dev (see Delegate).
//
// Usage:
//
//	consumer run     [--config FILE]   run the configured group until SIGINT/SIGTERM
//	consumer migrate [--config FILE] [--print]
//	                                   apply the schema and create the configured topic
//	consumer dlq     list|replay|discard  dead-letter admin
//	consumer offsets reset --group G --to earliest|latest|offset:N|time:T [--force]
//	consumer group   pause|resume|cancel G
//	consumer status  [--config FILE] [--group G] [--json] [--watch [--interval D]]
//	consumer repartition --partitions N [--topic T]  change the partition count online
//	consumer maintain [--once]       segments, dead groups and retention without a consumer
//	consumer adopt   [--partitions N] [--dry-run|--print] [--bridge] | --unbridge
//	                                   move a seed-style deployment onto pgevents
//	consumer console [--config FILE] [--addr HOST:PORT]
//	                                   the operator console, without consumers
//	consumer demo    [--duration D]    producers and a consumer on a local PostgreSQL (consumer-dev)
//	consumer bench   [--quick] [--only CASES] [--json]  the benchmark table (consumer-dev)
//	consumer version                   the module version and the commit built
//
// The configuration file defaults to db-event-consumer.yml; DATABASE_URL
// overrides its databaseUrl. Exit status: 0 on success (and after a clean
// shutdown), 1 on a runtime failure, 2 on invalid configuration or usage,
// with the offending key named.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

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

const usage = `usage: consumer <command> [flags]

commands:
  run      run the configured consumer group until SIGINT or SIGTERM
  migrate  apply the schema migrations and create the configured topic
  dlq      list, replay or discard dead letters (consumer dlq -h)
  offsets reset --group G --to earliest|latest|offset:N|time:T [--force]
           move a group's positions (replay or skip)
  group pause|resume|cancel G
           change a group's subscription state
  status   each group's position, owner, lag, dead letters and halts per partition
  repartition --partitions N [--topic T]
           change a topic's partition count online
  maintain [--once]
           create segments, sweep dead groups, apply retention (where no consumer runs)
  adopt    [--partitions N] [--dry-run | --print] [--bridge] | --unbridge
           move a seed-style deployment (its log and every group's position) onto pgevents
  console  [--addr HOST:PORT]
           serve the operator console (the file's console section), without consumers
  demo     run producers and a consumer group against a local PostgreSQL (consumer-dev)
  bench    [--quick] [--only CASES] [--json]  the benchmark table, BENCHMARKS.md (consumer-dev)
  version  print the module version and the commit the binary was built from

Run 'consumer <command> -h' for a command's flags.
`

// Command is a subcommand beyond the built-in ones, given to Main.
type Command struct {
	// Name is the word that selects it: consumer <Name> [flags].
	Name string
	// Run runs it with the arguments after its name.
	Run func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// Main runs the command line args (without the program name) until ctx
// ends, with the built-in subcommands and extra, and returns the process
// exit status.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, extra ...Command) int {
	return run(ctx, args, stdout, stderr, extra)
}

// run executes one command and returns the process exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, extra []Command) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "run":
		err = runCmd(ctx, args[1:], stdout, stderr)
	case "migrate":
		err = migrateCmd(ctx, args[1:], stdout, stderr)
	case "dlq":
		err = dlqCmd(ctx, args[1:], stdout, stderr)
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
		err = consoleCmd(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		err = versionCmd(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		i := slices.IndexFunc(extra, func(c Command) bool { return c.Name == args[0] })
		if i < 0 {
			fmt.Fprintf(stderr, "consumer: unknown command %q\n%s", args[0], usage)
			return exitUsage
		}
		err = extra[i].Run(ctx, args[1:], stdout, stderr)
	}
	return exitCode(err, stderr)
}

func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var status *exitStatus
	if errors.As(err, &status) {
		return status.code // a delegated command's, which said why itself
	}
	fmt.Fprintf(stderr, "consumer: %v\n", err)
	var ue *usageError
	var ce *config.Error
	if errors.As(err, &ue) || errors.As(err, &ce) {
		return exitUsage
	}
	return exitFailure
}
