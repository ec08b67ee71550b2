package consumercli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDlqUsage: `dlq -h` and an unknown subcommand print the subcommands'
// usage, before any configuration file is read.
func TestDlqUsage(t *testing.T) {
	for _, sub := range []string{"-h", "purge"} {
		var stdout, stderr bytes.Buffer
		code := (&CLI{Name: "consumer"}).Main(context.Background(), []string{"dlq", sub, "--config", "/nonexistent.yml"}, &stdout, &stderr)
		if code != exitUsage {
			t.Errorf("dlq %s: exit status %d, want %d", sub, code, exitUsage)
		}
		out := stderr.String()
		if !strings.Contains(out, "consumer dlq list") || strings.Contains(out, "nonexistent") {
			t.Errorf("dlq %s printed:\n%s", sub, out)
		}
	}
}
