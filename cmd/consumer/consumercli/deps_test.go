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
// error codes are classified in sink/kafka).
func TestProductionDependencies(t *testing.T) {
	deps := func(pkg string) string {
		t.Helper()
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		return string(out)
	}
	// The production binary, and a service's own built on this package.
	for _, bin := range []string{"..", "./example-service"} {
		linked := deps(bin)
		for _, banned := range []string{"internal/pgcluster", "internal/bench", "internal/demo", "franz-go/pkg/kfake"} {
			if strings.Contains(linked, banned) {
				t.Errorf("%s links %s", bin, banned)
			}
		}
	}
	if dev := deps("../../consumer-dev"); !strings.Contains(dev, "internal/bench") || !strings.Contains(dev, "internal/demo") {
		t.Error("cmd/consumer-dev lacks the benchmark or the demo")
	}
	root := deps("../../..")
	if strings.Contains(root, "yaml") {
		t.Error("the pgevents package pulls in a YAML package")
	}
	if strings.Contains(root, "franz-go") {
		t.Error("the pgevents package links a Kafka client (franz-go)")
	}
}

// TestUsesOnlyPublicLayers: the CLI, the binary and the console reach the
// engine (internal/store, internal/lease) only through public packages
// (offsets, partition, the root package), as a service's own tools would.
func TestUsesOnlyPublicLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", ".", "..", "../../../console").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ": ")
		for _, imp := range strings.Fields(imports) {
			for _, engine := range []string{"/internal/store", "/internal/lease"} {
				if strings.HasSuffix(imp, engine) {
					t.Errorf("%s imports the engine package %s: use a public one", pkg, imp)
				}
			}
		}
	}
}
