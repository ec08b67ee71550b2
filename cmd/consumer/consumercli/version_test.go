package consumercli

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionFromBuildInfo checks `consumer version` without -X overrides
// (go build in a git checkout, go install) and with them (the image).
func TestVersionFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/pgevents/pgevents", Version: "v1.4.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "aaaa"},
			{Key: "vcs.modified", Value: "true"},
			{Key: "vcs.time", Value: "2025-11-22T21:01:00Z"},
		},
	}
	got := readVersion(bi, "", "").format("consumer")
	for _, want := range []string{"consumer v1.4.0\n", "module   github.com/pgevents/pgevents\n", "commit   aaaa (modified)\n", "time     2025-11-22T21:01:00Z\n", "go       go1.26.8 "} {
		if !strings.Contains(got, want) {
			t.Errorf("from build info: %q lacks %q", got, want)
		}
	}
	got = readVersion(bi, "v1.4.1-rc1", "bbbb").format("consumer")
	for _, want := range []string{"consumer v1.4.1-rc1\n", "commit   bbbb\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("with -X overrides: %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "modified") || strings.Contains(got, "2025-11-22") {
		t.Errorf("with -X overrides, the recorded commit's details remain: %q", got)
	}
	got = readVersion(nil, "", "").format("consumer")
	if !strings.Contains(got, "consumer (devel)\n") || !strings.Contains(got, "commit   unknown\n") {
		t.Errorf("without build info: %q", got)
	}

	var stdout, stderr bytes.Buffer
	if code := Main(t.Context(), []string{"version"}, &stdout, &stderr); code != exitOK || !strings.Contains(stdout.String(), "module   github.com/pgevents/pgevents") {
		t.Errorf("consumer version: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if Main(t.Context(), []string{"help"}, &stdout, &stderr); !strings.Contains(stdout.String(), "\n  version ") {
		t.Errorf("usage lacks the version command:\n%s", stdout.String())
	}
}
