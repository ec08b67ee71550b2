package metrics_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/metrics"
	"github.com/pgevents/pgevents/pgeventstest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newTopic returns a pool on a fresh migrated database holding topic 1
// with the given partition count.
func newTopic(t *testing.T, partitions int) *pgxpool.Pool {
	t.Helper()
	return pgtest.TopicPool(t, partitions)
}

// runConsumer runs a consumer on pool's database, with the production
// pool settings, until the returned stop function is called (or the test
// ends), and waits until its listener is connected.
func runConsumer(t *testing.T, pool *pgxpool.Pool, cfg pgevents.Config) (*pgevents.Consumer, func()) {
	t.Helper()
	return pgeventstest.StartConsumer(t, pool.Config().ConnString(), cfg)
}

// startServer runs a metrics server on 127.0.0.1:0 until the test ends and
// returns its base URL.
func startServer(t *testing.T, cfg metrics.ServerConfig) string {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	srv, err := metrics.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return "http://" + srv.Addr()
}

// get fetches url and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// families is a parsed scrape.
type families map[string]*dto.MetricFamily

// scrape fetches base+"/metrics" over HTTP and parses the text format.
func scrape(t *testing.T, base string) families {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d\n%s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// labels matches a series whose labels include all of these.
type labels map[string]string

func (l labels) match(m *dto.Metric) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := l[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(l)
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// sum adds the values of the family's series matching l (histograms: their
// sample counts); ok is false when no series matches.
func (f families) sum(name string, l labels) (float64, bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	var total float64
	found := false
	for _, m := range fam.GetMetric() {
		if l.match(m) {
			total += metricValue(m)
			found = true
		}
	}
	return total, found
}

// value is sum for exactly one series, failing the test when it is absent.
func (f families) value(t *testing.T, name string, l labels) float64 {
	t.Helper()
	fam := f[name]
	if fam == nil {
		t.Fatalf("metric %s absent; have %s", name, f.names())
	}
	var hits []*dto.Metric
	for _, m := range fam.GetMetric() {
		if l.match(m) {
			hits = append(hits, m)
		}
	}
	if len(hits) != 1 {
		t.Fatalf("metric %s%v: %d series match, want 1", name, l, len(hits))
	}
	return metricValue(hits[0])
}

// histogramSum returns the sample sum of the histogram series matching l.
func (f families) histogramSum(t *testing.T, name string, l labels) float64 {
	t.Helper()
	for _, m := range f[name].GetMetric() {
		if l.match(m) && m.Histogram != nil {
			return m.Histogram.GetSampleSum()
		}
	}
	t.Fatalf("histogram %s%v absent", name, l)
	return 0
}

func (f families) names() string {
	var ns []string
	for n := range f {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return strings.Join(ns, " ")
}

func part(p int) string { return fmt.Sprint(p) }
