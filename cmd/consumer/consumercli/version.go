package consumercli

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// version and commit override what the Go toolchain records in the binary
// (the main module's version, vcs.revision). scripts/build-static.sh sets
// them with -ldflags "-X github.com/pgevents/pgevents/cmd/consumer/consumercli.version=... -X ...consumercli.commit=...", from git
// describe and git rev-parse, because the image build has no .git to
// record.
var (
	version string
	commit  string
)

// buildVersion describes how the binary was built.
type buildVersion struct {
	Module   string // the main module's path
	Version  string // the main module's version, or what -X ...consumercli.version said
	Commit   string // the VCS revision, or what -X ...consumercli.commit said
	Modified bool   // the working tree had uncommitted changes (vcs.modified)
	Time     string // the commit's time (vcs.time), RFC 3339
	Go       string // the toolchain's version
}

// readVersion combines the build information recorded by the toolchain
// (bi may be nil) with the -X overrides.
func readVersion(bi *debug.BuildInfo, version, commit string) buildVersion {
	v := buildVersion{Module: "github.com/pgevents/pgevents", Go: runtime.Version()}
	if bi != nil {
		v.Module, v.Version, v.Go = bi.Main.Path, bi.Main.Version, bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			case "vcs.time":
				v.Time = s.Value
			}
		}
	}
	if version != "" {
		v.Version = version
	}
	if commit != "" && commit != v.Commit {
		// The recorded modification flag and time belong to another commit
		// (or to none); git describe --dirty says "-dirty" itself.
		v.Commit, v.Modified, v.Time = commit, false, ""
	}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	return v
}

// format formats v as `<name> version` prints it, name being the
// binary's.
func (v buildVersion) format(name string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", name, v.Version)
	fmt.Fprintf(&b, "module   %s\n", v.Module)
	commit := v.Commit
	if v.Modified {
		commit += " (modified)"
	}
	fmt.Fprintf(&b, "commit   %s\n", commit)
	if v.Time != "" {
		fmt.Fprintf(&b, "time     %s\n", v.Time)
	}
	fmt.Fprintf(&b, "go       %s %s/%s\n", v.Go, runtime.GOOS, runtime.GOARCH)
	return b.String()
}

// versionCmd prints the module's version and the commit the binary was
// built from, under the binary's name.
func versionCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "version", "", "Prints the module version and the commit the binary was built from.")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("version: unexpected argument %q", fs.Arg(0))
	}
	bi, _ := debug.ReadBuildInfo()
	fmt.Fprint(stdout, readVersion(bi, version, commit).format(cmdName(ctx)))
	return nil
}
