package consumercli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/pgevents/pgevents/config"
)

// TestDeployFiles checks the shipped deployment files: every Kubernetes
// manifest parses, the ConfigMap's configuration is valid for the binary,
// and the systemd units run the binary with a configuration file.
func TestDeployFiles(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://example/db")
	manifests, err := filepath.Glob("../../../deploy/k8s/*.yaml")
	if err != nil || len(manifests) < 3 {
		t.Fatalf("k8s manifests: %v, %v", manifests, err)
	}
	kinds := map[string]bool{}
	for _, path := range manifests {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var doc struct {
				Kind string            `yaml:"kind"`
				Data map[string]string `yaml:"data"`
			}
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			kinds[doc.Kind] = true
			if yml, ok := doc.Data["db-event-consumer.yml"]; ok {
				if _, err := config.Parse([]byte(yml)); err != nil {
					t.Errorf("%s: the configuration does not load: %v", path, err)
				}
			}
		}
	}
	for _, k := range []string{"Deployment", "ConfigMap", "PodDisruptionBudget", "Secret"} {
		if !kinds[k] {
			t.Errorf("no %s among the k8s manifests", k)
		}
	}
	for _, unit := range []string{"consumer.service", "consumer@.service"} {
		data, err := os.ReadFile(filepath.Join("../../../deploy/systemd", unit))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"ExecStart=/usr/local/bin/consumer run --config", "Restart=always", "RestartPreventExitStatus=2", "NoNewPrivileges=yes"} {
			if !strings.Contains(string(data), want) {
				t.Errorf("%s lacks %q", unit, want)
			}
		}
	}
	// The example configuration at the top of the repository loads too.
	if _, err := config.Load("../../../db-event-consumer.yml"); err != nil {
		t.Errorf("db-event-consumer.yml: %v", err)
	}
}

// unitFiles are the shipped systemd units.
var unitFiles = []string{"consumer.service", "consumer@.service"}

// TestSystemdVerify runs `systemd-analyze verify` on the shipped units,
// their binary's path replaced by the consumer the tests built (verify
// checks that the commands exist), and fails on any message it prints: a
// key in the wrong section (StartLimitIntervalSec in [Service]) is only a
// warning to systemd, "ignoring", and the setting silently lost. Skipped
// where systemd-analyze is not installed (Debian: package systemd, which
// .ci/run installs).
func TestSystemdVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian: apt-get install systemd): the units are not verified")
	}
	bin := binary(t)
	dir := t.TempDir()
	var paths []string
	for _, unit := range unitFiles {
		data, err := os.ReadFile(filepath.Join("../../../deploy/systemd", unit))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), "/usr/local/bin/consumer ") {
			t.Fatalf("%s does not run /usr/local/bin/consumer", unit)
		}
		p := filepath.Join(dir, unit)
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(data), "/usr/local/bin/consumer ", bin+" ")), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	out, err := exec.Command(analyze, append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", strings.Join(unitFiles, " "), err, out)
	}
}

// TestDeployingGuideSystemd runs the systemd commands of
// docs/deploying.md (its blocks marked <!-- runnable: sandbox -->) as
// written, in a sandbox: a clone's bin/consumer, deploy/ and
// db-event-consumer.yml in the working directory, /etc and /usr/local/bin
// under a temporary root, systemctl recorded instead of run. Then, for
// each unit the guide enables, every file the unit reads without a "-"
// (its EnvironmentFile, AssertPathExists, the --config of its commands)
// exists, the environment files set DATABASE_URL, and the configuration
// loads with that environment, an instance pN of the template with
// partitionId N: an instance can neither start without its files nor
// start on the example's databaseUrl unnoticed. And the units fail loudly
// without them: DATABASE_URL comes from a required environment file, the
// configuration is named by AssertPathExists.
func TestDeployingGuideSystemd(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	guide, err := os.ReadFile("../../../docs/deploying.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := markedBlocks(string(guide), "<!-- runnable: sandbox -->")
	if len(blocks) == 0 {
		t.Fatal("docs/deploying.md has no block marked <!-- runnable: sandbox -->")
	}
	work, root := t.TempDir(), t.TempDir()
	for _, d := range []string{"bin", "etc/systemd/system", "usr/local/bin", "stub"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	repo, _ := filepath.Abs("../../..")
	for _, link := range [][2]string{{binary(t), "bin/consumer"}, {filepath.Join(repo, "deploy"), "deploy"},
		{filepath.Join(repo, "db-event-consumer.yml"), "db-event-consumer.yml"}} {
		if err := os.Symlink(link[0], filepath.Join(work, link[1])); err != nil {
			t.Fatal(err)
		}
	}
	stub := "#!/bin/sh\necho \"$*\" >> " + filepath.Join(root, "systemctl.log") + "\n"
	if err := os.WriteFile(filepath.Join(root, "stub", "systemctl"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	sandboxed := func(s string) string {
		s = strings.ReplaceAll(s, "/etc/", root+"/etc/")
		return strings.ReplaceAll(s, "/usr/local/bin/", root+"/usr/local/bin/")
	}
	for i, b := range blocks {
		cmd := exec.Command(bash, "-euo", "pipefail", "-c", sandboxed(b))
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "PATH="+filepath.Join(root, "stub")+":"+os.Getenv("PATH"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("block %d of docs/deploying.md's systemd section: %v\n%s\n%s", i+1, err, b, out)
		}
	}
	log, err := os.ReadFile(filepath.Join(root, "systemctl.log"))
	if err != nil {
		t.Fatal(err)
	}
	var enabled []string
	for _, line := range strings.Split(string(log), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "enable" {
			for _, u := range f[1:] {
				if !strings.HasPrefix(u, "-") {
					enabled = append(enabled, u)
				}
			}
		}
	}
	if !slices.Contains(enabled, "consumer") || !slices.Contains(enabled, "consumer@p7") {
		t.Fatalf("the guide enables %v, want consumer and consumer@p0..p7", enabled)
	}
	for _, u := range enabled {
		name, instance, templated := strings.Cut(strings.TrimSuffix(u, ".service"), "@")
		file := name + ".service"
		if templated {
			file = name + "@.service"
		}
		unit, err := os.ReadFile(filepath.Join(root, "etc/systemd/system", file))
		if err != nil {
			t.Errorf("%s: the guide did not install its unit: %v", u, err)
			continue
		}
		env := map[string]string{}
		var configs, asserted []string
		urlRequired := false // a required environment file sets DATABASE_URL
		for _, line := range strings.Split(strings.ReplaceAll(string(unit), "%i", instance), "\n") {
			key, value, ok := strings.Cut(strings.TrimSpace(line), "=")
			if !ok || strings.HasPrefix(key, "#") {
				continue
			}
			optional := strings.HasPrefix(value, "-")
			path := sandboxed(strings.TrimPrefix(value, "-"))
			switch key {
			case "EnvironmentFile":
				data, err := os.ReadFile(path)
				if err != nil {
					if !optional {
						t.Errorf("%s: %s=%s: %v", u, key, value, err)
					}
					continue
				}
				for _, l := range strings.Split(string(data), "\n") {
					if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && !strings.HasPrefix(k, "#") {
						env[k] = v
						urlRequired = urlRequired || (k == "DATABASE_URL" && !optional)
					}
				}
			case "AssertPathExists":
				asserted = append(asserted, path)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: %s=%s: %v", u, key, value, err)
				}
			case "ExecStart", "ExecStartPre":
				f := strings.Fields(path)
				if i := slices.Index(f, "--config"); i >= 0 && i+1 < len(f) && !slices.Contains(configs, f[i+1]) {
					configs = append(configs, f[i+1])
				}
			}
		}
		if env["DATABASE_URL"] == "" {
			t.Errorf("%s: its environment files set no DATABASE_URL: it would run on the file's databaseUrl", u)
		}
		if !urlRequired {
			t.Errorf("%s reads DATABASE_URL from optional environment files only (EnvironmentFile=-...): without them it would start on the file's databaseUrl, silently", u)
		}
		for _, c := range configs {
			if !slices.Contains(asserted, c) {
				t.Errorf("%s: no AssertPathExists names %s: an instance without its file would fail only once the binary runs", u, c)
			}
			t.Setenv("DATABASE_URL", env["DATABASE_URL"])
			cfg, err := config.Load(c)
			if err != nil {
				t.Errorf("%s: %v", u, err)
				continue
			}
			if cfg.DatabaseURL != env["DATABASE_URL"] {
				t.Errorf("%s: runs on %s, not on its DATABASE_URL", u, cfg.DatabaseURL)
			}
			if p, ok := strings.CutPrefix(instance, "p"); ok && fmt.Sprint(cfg.PartitionID) != p {
				t.Errorf("%s: %s has partitionId %d, want %s", u, c, cfg.PartitionID, p)
			}
		}
		if len(configs) == 0 {
			t.Errorf("%s runs no command with --config", u)
		}
	}
}

// markedBlocks returns the content of each fenced code block of the
// Markdown md that the line marker precedes.
func markedBlocks(md, marker string) []string {
	var out []string
	lines := strings.Split(md, "\n")
	for i := 0; i+1 < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != marker || !strings.HasPrefix(lines[i+1], "```") {
			continue
		}
		var b []string
		for j := i + 2; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			b = append(b, lines[j])
		}
		out = append(out, strings.Join(b, "\n")+"\n")
	}
	return out
}
