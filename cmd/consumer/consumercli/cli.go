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
// with the offending key named. -h or --help after any command's words
// prints its usage to stdout and exits 0; a usage error prints it to
// stderr and exits 2. A name the database does not know (--group, a
// topic) is an error naming it, never an empty table.
package consumercli

import (
	"bytes"
	"context"
	"errors"
	"flag"
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
// usage. `-h` and `--help`, after the binary's name or after any command's
// words, print that usage to stdout and exit 0.
func (c *CLI) Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := c.name()
	ctx = context.WithValue(ctx, nameKey{}, name)
	if len(args) == 0 {
		fmt.Fprint(stderr, named(ctx, usage))
		return exitUsage
	}
	if isHelp(args[0]) || args[0] == "help" {
		fmt.Fprint(stdout, named(ctx, usage))
		return exitOK
	}
	if args[0] == "--version" {
		args = append([]string{"version"}, args[1:]...)
	}
	var err error
	if cmd := findCommand(builtins, args[0]); cmd != nil {
		err = c.runCommand(ctx, cmd, cmd.name, args[1:], stdout, stderr)
		if cmd.name == "run" && err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// Asked to stop (SIGINT, SIGTERM) before it had started:
			// a shutdown, not a failure.
			err = nil
		}
	} else if i := slices.IndexFunc(c.Commands, func(cmd Command) bool { return cmd.Name == args[0] }); i >= 0 {
		err = c.Commands[i].Run(ctx, args[1:], stdout, stderr)
	} else {
		fmt.Fprintf(stderr, "%s: unknown command %q\n%s", name, args[0], named(ctx, usage))
		return exitUsage
	}
	return exitCode(name, err, stderr)
}

// command is a built-in command of the CLI, or a subcommand of one: a
// leaf runs; a command with subcommands (dlq, offsets, group) only
// dispatches to them.
type command struct {
	name string
	// run runs a leaf with the arguments after its words.
	run func(c *CLI, ctx context.Context, args []string, stdout, stderr io.Writer) error
	// subs are the subcommands, and usage what -h (or a missing or
	// unknown subcommand) prints for them, {cmd} standing for the
	// binary's name.
	subs  []*command
	usage string
}

// builtins are the CLI's built-in commands: Main dispatches through this
// table, and the tests walk it, so a command added here is covered by the
// tests of -h. Its order is the usage's.
var builtins = []*command{
	{name: "run", run: (*CLI).runCmd},
	{name: "migrate", run: (*CLI).migrateCmd},
	{name: "dlq", usage: dlqUsage, subs: []*command{
		{name: "list", run: dlqSub("list")},
		{name: "replay", run: dlqSub("replay")},
		{name: "discard", run: dlqSub("discard")},
	}},
	{name: "offsets", usage: offsetsUsage, subs: []*command{
		{name: "show", run: plain(offsetsShow)},
		{name: "reset", run: plain(offsetsReset)},
	}},
	{name: "group", usage: groupUsage, subs: []*command{
		{name: "pause", run: groupAction("pause")},
		{name: "resume", run: groupAction("resume")},
		{name: "cancel", run: groupAction("cancel")},
		{name: "unhalt", run: plain(groupUnhalt)},
	}},
	{name: "status", run: plain(statusCmd)},
	{name: "repartition", run: plain(repartitionCmd)},
	{name: "maintain", run: plain(maintainCmd)},
	{name: "adopt", run: plain(adoptCmd)},
	{name: "console", run: (*CLI).consoleCmd},
	{name: "kafka", run: plain(kafkaCmd)},
	{name: "version", run: plain(versionCmd)},
}

// plain adapts a command that needs nothing of the CLI.
func plain(f func(ctx context.Context, args []string, stdout, stderr io.Writer) error) func(*CLI, context.Context, []string, io.Writer, io.Writer) error {
	return func(_ *CLI, ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return f(ctx, args, stdout, stderr)
	}
}

// findCommand returns the command of cmds called name, or nil.
func findCommand(cmds []*command, name string) *command {
	i := slices.IndexFunc(cmds, func(c *command) bool { return c.name == name })
	if i < 0 {
		return nil
	}
	return cmds[i]
}

// runCommand runs cmd, whose words are path, with args: a leaf runs; a
// command with subcommands runs the one args names, prints its usage to
// stdout for -h or --help, and refuses no subcommand or an unknown one,
// printing its usage to stderr (exit status 2).
func (c *CLI) runCommand(ctx context.Context, cmd *command, path string, args []string, stdout, stderr io.Writer) error {
	if cmd.run != nil {
		return cmd.run(c, ctx, args, stdout, stderr)
	}
	use := named(ctx, cmd.usage)
	var names []string
	for _, s := range cmd.subs {
		names = append(names, s.name)
	}
	switch {
	case len(args) == 0:
		fmt.Fprint(stderr, use)
		return usagef("%s: a subcommand is required: %s", path, strings.Join(names, ", "))
	case isHelp(args[0]) || args[0] == "help":
		fmt.Fprint(stdout, use)
		return nil
	}
	sub := findCommand(cmd.subs, args[0])
	if sub == nil {
		fmt.Fprint(stderr, use)
		return usagef("%s: unknown subcommand %q (%s has %s)", path, args[0], path, strings.Join(names, ", "))
	}
	return c.runCommand(ctx, sub, path+" "+sub.name, args[1:], stdout, stderr)
}

// isHelp says whether arg asks for help, as the flag package understands
// it: -h, -help, --h or --help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--h", "--help":
		return true
	}
	return false
}

// NewFlagSet returns the flag set of the command whose words are path (a
// command of CLI.Commands: its name), as the built-in commands make
// theirs: its usage, which -h prints, is "usage: <binary> <path>
// <synopsis>", then about ({cmd} standing for the binary's name), then its
// flags. Parse it with ParseFlags.
func NewFlagSet(ctx context.Context, path, synopsis, about string) *flag.FlagSet {
	fs := flag.NewFlagSet(path, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s %s", cmdName(ctx), path)
		if synopsis != "" {
			fmt.Fprintf(w, " %s", synopsis)
		}
		fmt.Fprintln(w)
		if about = strings.TrimSpace(about); about != "" {
			fmt.Fprintf(w, "\n%s\n", wrap(named(ctx, about), 76))
		}
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n == 0 {
			fmt.Fprintln(w, "\nFlags: none")
			return
		}
		fmt.Fprintln(w, "\nFlags:")
		fs.PrintDefaults()
	}
	return fs
}

// wrap breaks each paragraph of s (paragraphs are separated by a blank
// line) that is one long line into lines of at most width characters; a
// paragraph laid out on several lines already is left as it is.
func wrap(s string, width int) string {
	paras := strings.Split(s, "\n\n")
	for i, p := range paras {
		if strings.Contains(p, "\n") {
			continue
		}
		var b strings.Builder
		n := 0
		for _, w := range strings.Fields(p) {
			if n > 0 && n+1+len(w) > width {
				b.WriteString("\n")
				n = 0
			} else if n > 0 {
				b.WriteString(" ")
				n++
			}
			b.WriteString(w)
			n += len(w)
		}
		paras[i] = b.String()
	}
	return strings.Join(paras, "\n\n")
}

// ParseFlags parses args with fs as the built-in commands do: -h or
// --help prints fs's usage to stdout and returns an error wrapping
// flag.ErrHelp, for which Main exits with status 0 and prints nothing
// more; an invalid flag prints the flag package's message and the usage
// to stderr, and returns an error for which Main exits with status 2.
//
// Requested help goes to stdout, as GNU's --help does and as `consumer
// -h` always did, so that it pipes into a pager or grep; the flag
// package's own default (stderr) is for usage errors, which stay there.
func ParseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		_, _ = stdout.Write(buf.Bytes())
		return err
	case err != nil:
		_, _ = stderr.Write(buf.Bytes())
		return &exitStatus{code: exitUsage, err: err}
	}
	return nil
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
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK // -h printed the usage
	}
	var status *exitStatus
	if errors.As(err, &status) {
		return status.code // a delegated command's, or a flag's error: said already
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	var ue *usageError
	var ce *config.Error
	if errors.As(err, &ue) || errors.As(err, &ce) {
		return exitUsage
	}
	return exitFailure
}
