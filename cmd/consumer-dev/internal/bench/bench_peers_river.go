package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// benchRiverModule is the module path of the River program, in the
// folder bench/river of the repository: a module of its own, so that
// pgevents' go.mod does not depend on River, and that `go build ./...`,
// `go vet ./...` and the tests of this module leave it out.
const benchRiverModule = "github.com/pgevents/pgevents/bench/river"

// benchRiverProgram is the River program, built for this run.
type benchRiverProgram struct {
	exe     string
	tmp     string
	version string // River's version, from the program's first result
}

// benchBuildRiver finds the River program's module (the bench's --river
// flag, else bench/river in the repository around the current
// directory, else around this source file) and builds it with `go build`
// into a temporary folder.
func benchBuildRiver(ctx context.Context, e *benchEnv) (*benchRiverProgram, error) {
	goExe, err := exec.LookPath("go")
	if err != nil {
		return nil, errors.New("the peers case builds the River program (bench/river, a module of its own) with the go command, which is not on PATH: install Go or add it to PATH")
	}
	dir, err := benchRiverDir(e.riverDir)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "pgevents-bench-river-")
	if err != nil {
		return nil, err
	}
	r := &benchRiverProgram{exe: filepath.Join(tmp, "river"), tmp: tmp, version: benchRiverVersion(dir)}
	e.logf("peers: building the River program in %s ...", dir)
	began := time.Now()
	cmd := exec.CommandContext(ctx, goExe, "build", "-o", r.exe, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		r.close()
		return nil, fmt.Errorf("river program: go build in %s: %w: %s", dir, err, strings.TrimSpace(string(out)))
	}
	e.logf("peers: built in %s", time.Since(began).Round(100*time.Millisecond))
	return r, nil
}

// benchRiverDir returns the folder of the River program's module: dir
// when given, else bench/river of the first folder, from the current
// directory up, that has one, else the one beside this source file's
// repository (for `go run` from elsewhere).
func benchRiverDir(dir string) (string, error) {
	if dir != "" {
		if !benchIsRiverModule(dir) {
			return "", fmt.Errorf("--river %s: no go.mod of module %s there", dir, benchRiverModule)
		}
		return dir, nil
	}
	var tried []string
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			c := filepath.Join(d, "bench", "river")
			if benchIsRiverModule(c) {
				return c, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
		tried = append(tried, "bench/river above "+wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		// This file is cmd/consumer-dev/internal/bench/ of the repository.
		c := filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "bench", "river")
		if benchIsRiverModule(c) {
			return filepath.Clean(c), nil
		}
		tried = append(tried, filepath.Clean(c))
	}
	return "", fmt.Errorf("the River program's module (%s) not found (looked for %s): run the bench from the repository or give --river DIR", benchRiverModule, strings.Join(tried, ", "))
}

// benchIsRiverModule reports whether dir holds the River program's
// go.mod.
func benchIsRiverModule(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	first, _, _ := bytes.Cut(b, []byte("\n"))
	return strings.TrimSpace(string(first)) == "module "+benchRiverModule
}

// benchRiverVersion returns the version of River the module in dir
// requires, or "".
func benchRiverVersion(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "github.com/riverqueue/river" {
			return f[1]
		}
	}
	return ""
}

// close removes the build.
func (r *benchRiverProgram) close() { _ = os.RemoveAll(r.tmp) }

// how describes River's run for the report.
func (r *benchRiverProgram) how() string {
	return fmt.Sprintf("River %s (riverpgxv5), the program bench/river in a process of its own: producers BEGIN, Client.InsertTx, COMMIT; a River client in the same process, one queue, MaxWorkers 100, FetchCooldown and FetchPollInterval at River's minimum (1 ms), whose worker notes the time it is called; a job counts as handled once River's completer has written it completed", r.version)
}

// window runs the River program in mode m on db and reads its figures,
// and the CPU times at its marks.
func (r *benchRiverProgram) window(ctx context.Context, e *benchEnv, db *benchDB, m benchPeersMode) (benchPeersWindow, error) {
	args := []string{"-mode", m.String()}
	if m == benchPeersDrain {
		args = append(args, "-jobs", fmt.Sprint(e.peersBacklog()))
	} else {
		rate, producers, d := e.peersLoad(m)
		args = append(args, "-rate", fmt.Sprint(rate), "-producers", fmt.Sprint(producers), "-duration", d.String(), "-warmup", benchPeersWarmup.String())
	}
	cmd := exec.CommandContext(ctx, r.exe, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.url)
	stderr := &benchTail{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return benchPeersWindow{}, err
	}
	if err := cmd.Start(); err != nil {
		return benchPeersWindow{}, fmt.Errorf("start the River program: %w", err)
	}
	var (
		r0, r1         benchPeersReading
		ss             *benchSessionCPU
		parts          map[string]time.Duration
		started, ended bool
		res            *benchRiverLine
		perr           error
	)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		l, err := benchParseRiverLine(sc.Bytes())
		if err != nil {
			perr = err
			_ = cmd.Process.Kill()
			break
		}
		switch {
		case l.Type == "mark" && l.Mark == "start":
			r0, ss = e.peersStart(ctx, db.pool, cmd.Process.Pid)
			started = true
		case l.Type == "mark" && l.Mark == "end" && started:
			r1, parts = e.peersEnd(ss, cmd.Process.Pid)
			ended = true
		case l.Type == "result":
			res = &l
		}
	}
	if started && !ended && ss != nil {
		ss.stop() // the sessions' reader of a window that never ended
	}
	werr := cmd.Wait()
	switch {
	case perr != nil:
		return benchPeersWindow{}, fmt.Errorf("river program: %w", perr)
	case werr != nil:
		return benchPeersWindow{}, fmt.Errorf("river program %s: %w: %s", strings.Join(args, " "), werr, strings.TrimSpace(stderr.String()))
	case !started || !ended || res == nil:
		return benchPeersWindow{}, fmt.Errorf("river program %s: exited without its start and end marks and its result: %s", strings.Join(args, " "), strings.TrimSpace(stderr.String()))
	case res.Mode != m.String():
		return benchPeersWindow{}, fmt.Errorf("river program: result of mode %q, asked for %q", res.Mode, m)
	}
	r.version = res.River
	return res.window(r0, r1, parts), nil
}

// benchRiverLine is a line of the River program's output: a mark
// ({"type":"mark","mark":"start"|"end"}) or its result (bench/river's
// result type, the same fields).
type benchRiverLine struct {
	Type              string    `json:"type"`
	Mark              string    `json:"mark"`
	Mode              string    `json:"mode"`
	River             string    `json:"river"`
	Seconds           float64   `json:"seconds"`
	Jobs              int64     `json:"jobs"`
	Handled           int64     `json:"handled"`
	Offered           int64     `json:"offered"`
	Committed         int64     `json:"committed"`
	OnSchedule        int64     `json:"on_schedule"`
	LateP99Ms         float64   `json:"late_p99_ms"`
	CommitToHandlerMs []float64 `json:"commit_to_handler_ms"`
	CallToHandlerMs   []float64 `json:"call_to_handler_ms"`
	TxMs              []float64 `json:"tx_ms"`
	Rate              float64   `json:"rate"`
}

// benchParseRiverLine parses a line of the River program's output; a line
// that is not one of its objects, or a result without the figures of its
// mode, is an error.
func benchParseRiverLine(b []byte) (benchRiverLine, error) {
	var l benchRiverLine
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return l, fmt.Errorf("unexpected output %q: %w", benchShorten(b, 200), err)
	}
	if dec.More() {
		return l, fmt.Errorf("unexpected output %q: more than one object on the line", benchShorten(b, 200))
	}
	switch l.Type {
	case "mark":
		if l.Mark != "start" && l.Mark != "end" {
			return l, fmt.Errorf("unknown mark %q", l.Mark)
		}
	case "result":
		switch l.Mode {
		case "latency", "schedule":
			if len(l.CommitToHandlerMs) != 3 || len(l.CallToHandlerMs) != 3 || len(l.TxMs) != 2 {
				return l, fmt.Errorf("%s result without its percentiles: %q", l.Mode, benchShorten(b, 200))
			}
			if l.Offered <= 0 {
				return l, fmt.Errorf("%s result without the transactions offered: %q", l.Mode, benchShorten(b, 200))
			}
		case "drain":
			if l.Rate <= 0 || l.Jobs <= 0 {
				return l, fmt.Errorf("drain result without its rate: %q", benchShorten(b, 200))
			}
		default:
			return l, fmt.Errorf("result of unknown mode %q", l.Mode)
		}
	default:
		return l, fmt.Errorf("unexpected output %q: no type mark or result", benchShorten(b, 200))
	}
	return l, nil
}

// window returns the window a result describes, with the CPU readings
// taken at its marks and the sessions' CPU time by part between them.
func (l *benchRiverLine) window(r0, r1 benchPeersReading, sessions map[string]time.Duration) benchPeersWindow {
	var w benchPeersWindow
	if l.Mode == "drain" {
		w.setCPU(r0, r1, sessions, l.Jobs)
		w.drainRate = l.Rate
		return w
	}
	w.setCPU(r0, r1, sessions, l.Handled)
	w.commit = [2]float64{l.CommitToHandlerMs[0], l.CommitToHandlerMs[1]}
	w.call = [2]float64{l.CallToHandlerMs[0], l.CallToHandlerMs[1]}
	w.tx = [2]float64{l.TxMs[0], l.TxMs[1]}
	w.offered, w.committed, w.onTime = l.Offered, l.Committed, l.OnSchedule
	return w
}

// benchShorten returns b cut to at most n bytes.
func benchShorten(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
