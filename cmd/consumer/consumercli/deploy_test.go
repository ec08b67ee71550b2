package consumercli

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
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
