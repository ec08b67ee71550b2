package metrics

import (
	"net/http"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// Handler serves the metrics of several groups' Metrics on one /metrics
// endpoint, for a process that runs several consumer groups. Families of
// the same name are merged; a series (name and labels) that more than one
// registry exposes, such as the process-wide go_* runtime metrics or
// pgevents_notification_queue_usage, is taken from the first.
func Handler(ms ...*Metrics) http.Handler {
	gs := make(merged, len(ms))
	for i, m := range ms {
		gs[i] = m.reg
	}
	return promhttp.HandlerFor(gs, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// merged gathers several registries into one exposition.
type merged []prometheus.Gatherer

// Gather implements prometheus.Gatherer.
func (g merged) Gather() ([]*dto.MetricFamily, error) {
	byName := map[string]*dto.MetricFamily{}
	seen := map[string]bool{} // family name + label signature
	var firstErr error
	for _, r := range g {
		mfs, err := r.Gather()
		if err != nil && firstErr == nil {
			firstErr = err
		}
		for _, mf := range mfs {
			out := byName[mf.GetName()]
			if out == nil {
				out = &dto.MetricFamily{Name: mf.Name, Help: mf.Help, Type: mf.Type}
				byName[mf.GetName()] = out
			}
			for _, m := range mf.Metric {
				key := mf.GetName() + "\x00" + signature(m)
				if seen[key] {
					continue
				}
				seen[key] = true
				out.Metric = append(out.Metric, m)
			}
		}
	}
	out := make([]*dto.MetricFamily, 0, len(byName))
	for _, mf := range byName {
		out = append(out, mf)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, firstErr
}

// signature identifies a series by its labels.
func signature(m *dto.Metric) string {
	var b strings.Builder
	for _, l := range m.Label {
		b.WriteString(l.GetName())
		b.WriteByte('=')
		b.WriteString(l.GetValue())
		b.WriteByte(0)
	}
	return b.String()
}
