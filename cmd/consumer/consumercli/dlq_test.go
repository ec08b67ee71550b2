package consumercli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDlqUsage: `dlq -h` prints the subcommands' usage to stdout and exits
// 0; an unknown subcommand prints it to stderr and exits 2; both before
// any configuration file is read.
func TestDlqUsage(t *testing.T) {
	for _, tt := range []struct {
		sub  string
		code int
	}{{"-h", exitOK}, {"purge", exitUsage}} {
		var stdout, stderr bytes.Buffer
		code := (&CLI{Name: "consumer"}).Main(context.Background(), []string{"dlq", tt.sub, "--config", "/nonexistent.yml"}, &stdout, &stderr)
		if code != tt.code {
			t.Errorf("dlq %s: exit status %d, want %d", tt.sub, code, tt.code)
		}
		out := stdout.String() + stderr.String()
		if !strings.Contains(out, "consumer dlq list") || strings.Contains(out, "nonexistent") {
			t.Errorf("dlq %s printed:\n%s", tt.sub, out)
		}
	}
}
