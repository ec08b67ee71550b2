package consumercli

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/sink"
	"github.com/pgevents/pgevents/sink/kafkasink"
	"github.com/pgevents/pgevents/sink/webhook"
)

// sinkMetrics are the relays' metrics of this process (label group tells
// the groups apart), served with the first group's metrics.
var sinkMetrics = sink.NewMetrics()

// buildSink creates the relay that handler i of group g of cfg configures
// (type kafka or http) and the function that closes it. The options are
// the file's (config.Handler.KafkaOptions, WebhookOptions), already
// validated by the relay's own rules when the file was loaded; what can
// still fail here (a TLS file that cannot be read, options franz-go
// refuses) is a configuration error naming the handler's key.
func buildSink(cfg *config.Config, g, i int, h *config.Handler) (pgevents.Handler, func(), error) {
	keyErr := func(key, msg string) error {
		return &config.Error{Key: cfg.KeyPath(g, fmt.Sprintf("handlers[%d].%s", i, key)), Msg: msg}
	}
	relayErr := func(err error, otherwise string) error {
		var oe *sink.OptionError
		if errors.As(err, &oe) {
			return keyErr(oe.Path(), oe.Msg)
		}
		return keyErr(otherwise, err.Error())
	}
	var tlsConfig *tls.Config // nil: plaintext (kafka), the defaults (http)
	if h.TLS != nil {
		c, err := h.TLS.Files().Config()
		if err != nil {
			return nil, nil, keyErr("tls", err.Error())
		}
		tlsConfig = c
	}
	switch h.Type {
	case "kafka":
		opts := h.KafkaOptions()
		opts.TLS, opts.Metrics = tlsConfig, sinkMetrics
		s, err := kafkasink.New(opts)
		if err != nil {
			return nil, nil, relayErr(err, "brokers")
		}
		return s, s.Close, nil
	case "http":
		opts := h.WebhookOptions()
		opts.TLS, opts.Metrics = tlsConfig, sinkMetrics
		s, err := webhook.New(opts)
		if err != nil {
			return nil, nil, relayErr(err, "url")
		}
		return s, s.Close, nil
	}
	return nil, nil, keyErr("type", fmt.Sprintf("%q is not a relay", h.Type))
}
