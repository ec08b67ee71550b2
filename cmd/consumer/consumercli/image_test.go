package consumercli

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// buildScript is the one build of the image's binary, run by the Dockerfile.
const buildScript = "scripts/build-static.sh"

// TestStaticBinary builds the binary with the script the Dockerfile runs,
// passing VERSION and COMMIT as the Dockerfile passes its build arguments,
// and checks what the image relies on: the binary is static (no program
// interpreter, no shared libraries), built with CGO_ENABLED=0 and -trimpath,
// prints the module, version and commit, and runs with an empty environment
// as the image's user, exiting 2 on an invalid configuration without
// needing a database.
func TestStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary from scratch (-short)")
	}
	t.Parallel()
	commit := "0123456789abcdef0123456789abcdef01234567"
	if out, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(out))
	}
	const version = "v0.0.0-imagetest"

	// Not t.TempDir, whose parent is private: the image's user runs it.
	dir, err := os.MkdirTemp("", "pgevents-image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "consumer")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "sh", buildScript, bin)
	build.Dir = "../../.."
	build.Env = append(os.Environ(), "VERSION="+version, "COMMIT="+commit)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", buildScript, err, out)
	}

	// Static: no PT_INTERP (the dynamic loader) and nothing to link at run
	// time.
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary has a %v program header: it is not static", p.Type)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v (%v)", libs, err)
	}
	// Stripped: -s drops the symbol table, -w the DWARF sections.
	for _, s := range f.Sections {
		if s.Name == ".symtab" || strings.HasPrefix(s.Name, ".debug_") {
			t.Errorf("the binary has a %s section: not built with -s -w", s.Name)
		}
	}
	_ = f.Close()
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		t.Errorf("build settings CGO_ENABLED=%q -trimpath=%q; want 0 and true", settings["CGO_ENABLED"], settings["-trimpath"])
	}

	// Run it as in the image: no environment but the configuration's, and
	// as the image's user when the test can switch to it.
	run := func(args ...string) (int, string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = "/"
		cmd.Env = []string{"DATABASE_URL=postgres://nowhere.invalid/db"}
		if os.Getuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
		}
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState == nil {
			t.Fatalf("%s %v: %v", bin, args, err)
		}
		return cmd.ProcessState.ExitCode(), string(out)
	}
	code, out := run("version")
	for _, want := range []string{"consumer " + version + "\n", "module   github.com/pgevents/pgevents\n", "commit   " + commit + "\n"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("consumer version: exit %d, output lacks %q:\n%s", code, want, out)
		}
	}
	cfg := filepath.Join(dir, "bad.yml")
	if err := os.WriteFile(cfg, []byte("groupId: g\nbatchSize: -5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out := run("run", "--config", cfg); code != exitUsage || !strings.Contains(out, "batchSize") {
		t.Errorf("consumer run with an invalid configuration: exit %d, want %d naming batchSize:\n%s", code, exitUsage, out)
	}
}

// TestBuildScriptDescribesGit checks the version and commit the build
// script stamps by default (make static and make image pass them on):
// git describe and git rev-parse HEAD, unless VERSION and COMMIT say
// otherwise.
func TestBuildScriptDescribesGit(t *testing.T) {
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	describe := func(flag string, env ...string) string {
		t.Helper()
		cmd := exec.Command("sh", buildScript, flag)
		cmd.Dir = "../../.."
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
			return strings.HasPrefix(kv, "VERSION=") || strings.HasPrefix(kv, "COMMIT=")
		}), env...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s %s: %v", buildScript, flag, err)
		}
		return strings.TrimSpace(string(out))
	}
	if got := describe("--commit"); got != strings.TrimSpace(string(head)) {
		t.Errorf("--commit = %q, want git rev-parse HEAD = %s", got, head)
	}
	want, err := exec.Command("git", "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := describe("--version"); got != strings.TrimSpace(string(want)) {
		t.Errorf("--version = %q, want git describe --tags --always --dirty = %s", got, want)
	}
	if got := describe("--version", "VERSION=v9.9.9"); got != "v9.9.9" {
		t.Errorf("--version with VERSION=v9.9.9 = %q", got)
	}
}

// instruction is one Dockerfile instruction.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
}

// dockerStages parses a Dockerfile into stages of instructions: comments
// and blank lines dropped, continuation lines joined.
func dockerStages(t *testing.T, path string) [][]instruction {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]instruction
	var cur string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur == "" && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cur += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		cur += line
		cmd, args, _ := strings.Cut(cur, " ")
		cur = ""
		in := instruction{strings.ToUpper(cmd), strings.Join(strings.Fields(args), " ")}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("%s: %s before the first FROM", path, in.cmd)
			}
			continue
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	return stages
}

// TestDockerfile checks the Dockerfile's invariants, and that it agrees
// with the Kubernetes Deployment and the Makefile: a multi-stage build with
// a Go builder of go.mod's version running the shared build script; a final
// stage on a base with CA certificates, holding only the binary, as a
// numeric non-root user equal to the Deployment's runAsUser, with the
// Deployment's arguments as CMD and its metrics port exposed; and the
// image name `make image` tags is the one the Deployment runs.
func TestDockerfile(t *testing.T) {
	stages := dockerStages(t, "../../../Dockerfile")
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a builder and a final stage", len(stages))
	}

	// The builder: golang at go.mod's minor version, running the script.
	gomod, err := os.ReadFile("../../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if goVersion == nil {
		t.Fatal("go.mod has no go directive")
	}
	from := strings.Fields(stages[0][0].args)
	if len(from) != 3 || !strings.EqualFold(from[1], "AS") || !regexp.MustCompile(`^golang:`+regexp.QuoteMeta(string(goVersion[1]))+`([.-]|$)`).MatchString(from[0]) {
		t.Fatalf("first stage FROM %s; want golang:%s AS <name>", stages[0][0].args, goVersion[1])
	}
	builder := from[2]
	var output string
	for _, in := range stages[0] {
		if in.cmd == "RUN" && strings.Contains(in.args, buildScript) {
			f := strings.Fields(in.args)
			if i := slices.Index(f, buildScript); i+1 < len(f) {
				output = f[i+1]
			}
			if strings.Contains(in.args, "CGO_ENABLED") || strings.Contains(in.args, "go build") {
				t.Errorf("the build step overrides the script: RUN %s", in.args)
			}
		}
	}
	if output == "" {
		t.Fatalf("no RUN of %s OUTPUT in the builder stage", buildScript)
	}
	script, err := os.ReadFile(filepath.Join("../../..", buildScript))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^CGO_ENABLED=0 exec go build -trimpath `).Match(script) {
		t.Errorf("%s does not build with CGO_ENABLED=0 and -trimpath", buildScript)
	}

	// The final stage.
	final := stages[len(stages)-1]
	base := strings.Fields(final[0].args)[0]
	last := map[string]string{}
	var copies []string
	for _, in := range final {
		last[in.cmd] = in.args
		if in.cmd == "COPY" {
			copies = append(copies, in.args)
		}
	}
	// distroless/static and /base carry /etc/ssl/certs/ca-certificates.crt;
	// another base must have them copied in.
	if !regexp.MustCompile(`^gcr\.io/distroless/(static|base)(-debian\d+)?(:|@|$)`).MatchString(base) &&
		!slices.ContainsFunc(copies, func(c string) bool { return strings.Contains(c, "ca-certificates.crt") }) {
		t.Errorf("final base %s: no CA certificates", base)
	}
	if want := "--from=" + builder + " " + output + " /consumer"; !slices.Contains(copies, want) {
		t.Errorf("final stage copies %q, want COPY %s", copies, want)
	}
	user, _, _ := strings.Cut(last["USER"], ":")
	uid, err := strconv.Atoi(user)
	if err != nil || uid == 0 {
		t.Errorf("final stage USER %q: want a numeric non-root user (runAsNonRoot can only verify a number)", last["USER"])
	}
	var entrypoint, cmd []string
	if err := json.Unmarshal([]byte(last["ENTRYPOINT"]), &entrypoint); err != nil || !slices.Equal(entrypoint, []string{"/consumer"}) {
		t.Errorf("ENTRYPOINT %s (%v), want [\"/consumer\"]", last["ENTRYPOINT"], err)
	}
	if err := json.Unmarshal([]byte(last["CMD"]), &cmd); err != nil {
		t.Errorf("CMD %s: %v", last["CMD"], err)
	}

	// The Deployment: image, user, arguments, port.
	var deploy struct {
		Spec struct {
			Template struct {
				Spec struct {
					SecurityContext struct {
						RunAsUser    int  `yaml:"runAsUser"`
						RunAsNonRoot bool `yaml:"runAsNonRoot"`
					} `yaml:"securityContext"`
					InitContainers []container `yaml:"initContainers"`
					Containers     []container `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	data, err := os.ReadFile("../../../deploy/k8s/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &deploy); err != nil {
		t.Fatal(err)
	}
	pod := deploy.Spec.Template.Spec
	if !pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser != uid {
		t.Errorf("Deployment runAsNonRoot %v, runAsUser %d; the image's user is %d", pod.SecurityContext.RunAsNonRoot, pod.SecurityContext.RunAsUser, uid)
	}
	makefile, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	image := regexp.MustCompile(`(?m)^IMAGE\s*\?=\s*(\S+)`).FindSubmatch(makefile)
	if image == nil {
		t.Fatal("the Makefile sets no IMAGE")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers in the Deployment, want 1", len(pod.Containers))
	}
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		if repo, _, _ := strings.Cut(c.Image, ":"); repo != string(image[1]) {
			t.Errorf("container %s runs %s; make image builds %s", c.Name, c.Image, image[1])
		}
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Args, cmd) {
		t.Errorf("the Deployment runs %q, the image's CMD is %q", c.Args, cmd)
	}
	var ports []string
	for _, p := range c.Ports {
		ports = append(ports, strconv.Itoa(p.ContainerPort))
	}
	if exposed := strings.Fields(last["EXPOSE"]); !slices.Equal(exposed, ports) {
		t.Errorf("the image exposes %v, the Deployment's container ports are %v", exposed, ports)
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	if data, err := os.ReadFile("../../../deploy/k8s/configmap.yaml"); err != nil {
		t.Fatal(err)
	} else if err := yaml.Unmarshal(data, &cm); err != nil {
		t.Fatal(err)
	}
	var consumerCfg struct {
		MetricsAddr string `yaml:"metricsAddr"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["db-event-consumer.yml"]), &consumerCfg); err != nil {
		t.Fatal(err)
	}
	if _, port, _ := strings.Cut(consumerCfg.MetricsAddr, ":"); !slices.Contains(ports, port) {
		t.Errorf("the ConfigMap's metricsAddr %q is not on the Deployment's container ports %v", consumerCfg.MetricsAddr, ports)
	}
	if i := slices.Index(cmd, "--config"); i < 0 || i+1 == len(cmd) {
		t.Errorf("the image's CMD %q names no --config file", cmd)
	} else if !slices.ContainsFunc(c.VolumeMounts, func(m mount) bool { return filepath.Dir(cmd[i+1]) == m.MountPath }) {
		t.Errorf("the image's CMD reads %s, in no volume the Deployment mounts", cmd[i+1])
	}

	// The build context leaves out .git and the demo's cluster.
	ignore, err := os.ReadFile("../../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(ignore), "\n")
	for _, want := range []string{".git", ".pgevents-demo", ".pgevents-bench"} {
		if !slices.Contains(lines, want) {
			t.Errorf(".dockerignore lacks %s", want)
		}
	}
}

// container is the part of a Kubernetes container spec TestDockerfile
// compares.
type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		ContainerPort int `yaml:"containerPort"`
	} `yaml:"ports"`
	VolumeMounts []mount `yaml:"volumeMounts"`
}

// mount is a container's volume mount.
type mount struct {
	MountPath string `yaml:"mountPath"`
}
