package consumercli

import (
	"os/exec"
	"strings"
	"testing"
)

// TestProductionDependencies: what the production binary links, and what
// a library user of pgevents pulls in. The throwaway-cluster launcher, the
// in-process Kafka broker, the benchmark and the demo live in consumer-dev
// only (not in a service's binary built on consumercli either); the root
// package brings neither the YAML decoder nor a Kafka client (Kafka's
// error codes are classified in sink/kafkasink). The benchmark and the demo are
// packages under cmd/consumer-dev/internal, which the Go toolchain already
// keeps other commands from importing; the test also checks that
// consumer-dev does link them, so that it tests the paths they live at.
func TestProductionDependencies(t *testing.T) {
	deps := func(pkg string) string {
		t.Helper()
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		return string(out)
	}
	const (
		module = "github.com/pgevents/pgevents/"
		bench  = module + "cmd/consumer-dev/internal/bench"
		demo   = module + "cmd/consumer-dev/internal/demo"
	)
	linksPkg := func(list, pkg string) bool {
		for _, line := range strings.Split(list, "\n") {
			if line = strings.TrimSpace(line); line == pkg || strings.HasPrefix(line, pkg+"/") {
				return true
			}
		}
		return false
	}
	// The production binary, and a service's own built on this package.
	for _, bin := range []string{"..", "./example-service"} {
		linked := deps(bin)
		for _, banned := range []string{module + "internal/pgcluster", module + "cmd/consumer-dev", "github.com/twmb/franz-go/pkg/kfake"} {
			if linksPkg(linked, banned) {
				t.Errorf("%s links %s", bin, banned)
			}
		}
	}
	dev := deps("../../consumer-dev")
	for _, pkg := range []string{bench, demo} {
		if !linksPkg(dev, pkg) {
			t.Errorf("cmd/consumer-dev does not link %s", pkg)
		}
	}
	root := deps("../../..")
	if strings.Contains(root, "yaml") {
		t.Error("the pgevents package pulls in a YAML package")
	}
	if strings.Contains(root, "franz-go") {
		t.Error("the pgevents package links a Kafka client (franz-go)")
	}
}

// The import rules between the module's packages (among them: the CLI, the
// console and the Kafka endpoint reach the engine only through public
// packages) are one table, checked by TestImportRules in
// internal/layers/layers_test.go.
