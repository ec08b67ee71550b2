// Package bench is `consumer bench` (in cmd/consumer-dev): pgevents measured
// on a real PostgreSQL with durable commits, each case on a fresh database,
// side by side against a baseline in the same run, printed as one table.
// BENCHMARKS.md says how each case measures, the last full run and what
// bounds each figure. Its statements go through the schema package for
// topics and segments, never through their table names.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/pgevents/pgevents/cmd/consumer/consumercli"
)

// benchCase is one case of `consumer bench`: a name for --only, a line for
// the progress output, and the function that measures it on env.
type benchCase struct {
	name string
	desc string
	run  func(ctx context.Context, env *benchEnv) ([]benchResult, error)
	// budget bounds the case in full mode; quick mode gets a third of it.
	budget time.Duration
}

// benchCases lists the cases in the order they run.
var benchCases = []benchCase{
	{"append", "append rate vs a plain-SQL baseline", benchAppend, 6 * time.Minute},
	{"producers", "producer throughput by producers and mode, with a consumer group attached, vs plain-table ceilings", benchProducers, 6 * time.Minute},
	{"latency", "commit-to-handler latency at fixed rates", benchLatency, 4 * time.Minute},
	{"notify", "notifications per committed transaction at steady rates, and an idle consumer's statements", benchNotify, 3 * time.Minute},
	{"snapshot", "producers and a consumer while a REPEATABLE READ snapshot is held open", benchSnapshot, 23 * time.Minute},
	{"drain", "burn-down of a preloaded backlog", benchDrain, 4 * time.Minute},
	{"sustained", "highest sustained end-to-end rate", benchSustained, 4 * time.Minute},
	{"resources", "CPU and peak RSS of a separate consumer process", benchResources, 3 * time.Minute},
	{"processes", "the deployments users run: 1, 8 and 16 consumer processes under 1,000 tx/s: schedule, latency, CPU per event, idle", benchProcesses, 9 * time.Minute},
	{"pgq", "producers of single-event transactions: plain insert, pgevents with and without a consumer, PgQ", benchPgq, 4 * time.Minute},
	{"peers", "pgevents beside River and PgQ in one run: commit → handler latency, producer transactions and CPU per event at 1,000 tx/s, 3,000 tx/s on schedule, drain", benchPeers, 18 * time.Minute},
	{"retention", "removing old events: segment drop vs DELETE, under producers", benchRetention, 3 * time.Minute},
	{"console", "every console page on a 10-million-event log with 10,000 dead letters", benchConsole, 45 * time.Minute},
	{"kafka", "relay into Kafka (in-process kfake) vs a bare franz-go producer; Kafka clients through the endpoint (consumer kafka): fetch, latency, produce", benchKafka, 10 * time.Minute},
	{"idempotency", "keyed appends (idempotency keys: new ones, and duplicates) vs unkeyed", benchIdempotency, 3 * time.Minute},
	{"tracing", "tracing on vs off: appends inside a span vs outside, and a drain with a TracerProvider vs without", benchTracing, 4 * time.Minute},
}

// benchCmd runs the benchmark cases on a throwaway PostgreSQL (or on
// DATABASE_URL), each in a fresh database, and prints the results table to
// stdout, or JSON with --json; progress goes to stderr.
func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := consumercli.NewFlagSet(ctx, "bench", "[--quick] [--only CASES] [--json] [--dir DIR] [--cpuprofile FILE] [--river DIR]",
		"Runs the benchmark cases of BENCHMARKS.md on a throwaway PostgreSQL (or on DATABASE_URL), each in a fresh database, and prints the results table.")
	asJSON := fs.Bool("json", false, "print the results as JSON instead of a table")
	quick := fs.Bool("quick", false, "shorter runs and one repetition (about 2 minutes instead of 10)")
	only := fs.String("only", "", "comma-separated cases to run (default all): "+strings.Join(benchCaseNames(), ","))
	dir := fs.String("dir", ".pgevents-bench", "folder of the throwaway PostgreSQL, unless DATABASE_URL is set")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the bench process (producers and in-process consumers) to `file`")
	riverDir := fs.String("river", "", "the River program's module `folder` for the peers case (default: bench/river of the repository around the current directory)")
	if err := consumercli.ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return consumercli.Usagef("bench: unexpected argument %q", fs.Arg(0))
	}
	cases, err := selectBenchCases(*only)
	if err != nil {
		return err
	}

	env, err := openBenchEnv(ctx, *dir, *quick, stderr)
	if err != nil {
		return err
	}
	defer env.close()
	env.riverDir = *riverDir
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	rep := benchReport{Header: env.header}
	var failed []string
	for _, c := range cases {
		budget := c.budget
		if *quick {
			budget /= 3
		}
		env.logf("== %s: %s (at most %s)", c.name, c.desc, budget)
		began := time.Now()
		before, cpu0 := env.serverActivity(ctx), env.cpu()
		cctx, cancel := context.WithTimeout(ctx, budget)
		rs, err := c.run(cctx, env)
		cancel()
		rep.Results = append(rep.Results, rs...)
		cpu := env.cpu().since(cpu0)
		rep.Cases = append(rep.Cases, benchCaseSummary{Case: c.name, Seconds: time.Since(began).Seconds(),
			Server: env.serverActivity(ctx).since(before), Busy: cpu.busy, Foreign: cpu.foreign})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			env.logf("== %s FAILED after %s: %v", c.name, time.Since(began).Round(time.Second), err)
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", c.name, err))
			failed = append(failed, c.name)
			continue
		}
		env.logf("== %s done in %s", c.name, time.Since(began).Round(time.Second))
	}
	rep.Header.Elapsed = time.Since(env.started).Round(time.Second).String()

	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.writeTable(stdout)
	}
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("bench: %d case(s) failed: %s", len(failed), strings.Join(failed, ", "))
	}
	return nil
}

// benchCaseNames returns the names --only accepts.
func benchCaseNames() []string {
	names := make([]string, len(benchCases))
	for i, c := range benchCases {
		names[i] = c.name
	}
	return names
}

// selectBenchCases returns the cases named in the comma-separated list
// only, in their usual order, or all of them when only is empty.
func selectBenchCases(only string) ([]benchCase, error) {
	if strings.TrimSpace(only) == "" {
		return benchCases, nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(only, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.Contains(benchCaseNames(), n) {
			return nil, consumercli.Usagef("bench: --only: unknown case %q (cases: %s)", n, strings.Join(benchCaseNames(), ", "))
		}
		want[n] = true
	}
	var out []benchCase
	for _, c := range benchCases {
		if want[c.name] {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("bench: --only names no case")
	}
	return out, nil
}

// Command is `consumer-dev bench`.
var Command = consumercli.Command{Name: "bench", Run: benchCmd}
