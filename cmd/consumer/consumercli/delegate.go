package consumercli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// DevBinary is the binary with the development commands (demo, bench):
// cmd/consumer-dev, this command plus them.
const DevBinary = "consumer-dev"

// modulePath is pgevents' module, whose clone can `go run` DevBinary.
const modulePath = "github.com/pgevents/pgevents"

// Delegate returns the Command name of the production binary that hands
// its arguments to consumer-dev, found next to this executable, else on the
// PATH, else run from source with `go run ./cmd/consumer-dev` when the
// working directory is in a clone of pgevents. Otherwise it fails, saying
// how to install consumer-dev. The exit status is consumer-dev's.
func Delegate(name string) Command {
	return Command{Name: name, Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		argv, err := devCommand()
		if err != nil {
			return fmt.Errorf("%s is a development command, in the %s binary: %w", name, DevBinary, err)
		}
		argv = append(append(argv, name), args...)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
		// Stop it as a terminal would: it finishes its work and cleans up.
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		cmd.WaitDelay = 30 * time.Second
		err = cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() > 0 {
			return &exitStatus{code: exit.ExitCode()}
		}
		return err
	}}
}

// devCommand returns the command line that runs consumer-dev.
func devCommand() ([]string, error) {
	if self, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(self), DevBinary); isExecutable(p) {
			return []string{p}, nil
		}
	}
	if p, err := exec.LookPath(DevBinary); err == nil {
		return []string{p}, nil
	}
	if root, ok := moduleRoot(); ok {
		if goBin, err := exec.LookPath("go"); err == nil {
			return []string{goBin, "run", filepath.Join(root, "cmd", DevBinary)}, nil
		}
	}
	return nil, fmt.Errorf("%s is neither next to this binary nor on the PATH; install it with "+
		"`go install %s/cmd/%s@latest`, or run `make demo` / `make bench` in a clone of pgevents", DevBinary, modulePath, DevBinary)
}

// moduleRoot returns the directory of the go.mod of pgevents' module that
// holds the working directory, if any.
func moduleRoot() (string, bool) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			first, _, _ := bytes.Cut(data, []byte("\n"))
			return dir, string(bytes.TrimSpace(first)) == "module "+modulePath
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// exitStatus carries to Main an exit status whose reason was printed
// already: a delegated command's, or that of a flag ParseFlags refused.
type exitStatus struct {
	code int
	err  error // what was printed, if known
}

func (e *exitStatus) Error() string {
	if e.err != nil {
		return e.err.Error()
	}
	return fmt.Sprintf("exit status %d", e.code)
}

func (e *exitStatus) Unwrap() error { return e.err }
