package kafka_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/kafka"
)

// TestConsoleShowsKafkaGroupLag: a Kafka consumer group is a pgevents
// group, so the console's group page shows its lag: the committed events
// it has not handled.
func TestConsoleShowsKafkaGroupLag(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4, "", kafka.Options{})
	want := e.produceRandom(3, 40, 5)
	n := total(want)
	s := newSeen()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := member(ctx, t, e.addr, "kgroup", "a", s, func() bool { return s.count() >= n/2 }); err != nil {
		t.Fatal(err)
	}
	handled := s.count()
	con, err := console.New(e.pool, console.Options{ReadOnly: true, Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/topics/1/groups/kgroup")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`id="group-lag"[^>]*>≈?(\d+)<`).FindSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		t.Fatalf("GET the Kafka group's page: %d, no lag shown\n%s", resp.StatusCode, body)
	}
	if lag, _ := strconv.Atoi(string(m[1])); lag != n-handled {
		t.Errorf("the console shows a lag of %d for the Kafka group, want %d (%d committed, %d handled and committed)", lag, n-handled, n, handled)
	}
}
