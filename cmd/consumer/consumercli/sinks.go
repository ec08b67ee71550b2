package consumercli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/sink"
	"github.com/pgevents/pgevents/sink/kafka"
	"github.com/pgevents/pgevents/sink/webhook"
)

// sinkMetrics are the relays' metrics of this process (label group tells
// the groups apart), served with the first group's metrics.
var sinkMetrics = sink.NewMetrics()

// buildSink creates the relay that handler i of cfg configures (type kafka
// or http) and the function that closes it. An option the relay refuses is
// a configuration error naming the handler's key.
func buildSink(cfg *config.Config, i int, h *config.Handler) (pgevents.Handler, func(), error) {
	keyErr := func(key, msg string) error {
		return &config.Error{Key: fmt.Sprintf("handlers[%d].%s", i, key), Msg: msg}
	}
	var tlsConfig *tls.Config // nil: plaintext (kafka), the defaults (http)
	if h.TLS != nil {
		c, err := sink.TLSFiles{CAFile: h.TLS.CAFile, CertFile: h.TLS.CertFile, KeyFile: h.TLS.KeyFile}.Config()
		if err != nil {
			return nil, nil, keyErr("tls", err.Error())
		}
		tlsConfig = c
	}
	switch h.Type {
	case "kafka":
		opts := kafka.Options{Name: h.Name, Brokers: h.Brokers, Topic: h.Topic, Key: h.Key, Format: kafka.Format(h.Format),
			Source: h.Source, DeliveryTimeout: time.Duration(h.DeliveryTimeoutMs) * time.Millisecond,
			MaxRecordBytes: h.MaxRecordBytes, TLS: tlsConfig, Metrics: sinkMetrics}
		if h.SASL != nil {
			opts.SASL = &kafka.SASL{Mechanism: h.SASL.Mechanism, User: h.SASL.User, Password: h.SASL.Password}
		}
		s, err := kafka.New(opts)
		var oe *kafka.OptionError
		if errors.As(err, &oe) {
			return nil, nil, keyErr(oe.Key, oe.Msg)
		}
		if err != nil {
			return nil, nil, keyErr("brokers", err.Error())
		}
		return s, s.Close, nil
	case "http":
		opts := webhook.Options{Name: h.Name, URL: h.URL, Method: h.Method, Headers: h.Headers,
			Timeout: time.Duration(h.TimeoutMs) * time.Millisecond, Format: webhook.Format(h.Format), Source: h.Source,
			Concurrency: h.Concurrency, TLS: tlsConfig, Metrics: sinkMetrics}
		s, err := webhook.New(opts)
		var oe *webhook.OptionError
		if errors.As(err, &oe) {
			return nil, nil, keyErr(oe.Key, oe.Msg)
		}
		if err != nil {
			return nil, nil, keyErr("url", err.Error())
		}
		return s, s.Close, nil
	}
	return nil, nil, keyErr("type", fmt.Sprintf("%q is not a relay", h.Type))
}
