package config

import (
	"fmt"
	"net/url"
	"os"
	"strconv"

	"gopkg.in/yaml.v3"
)

const keyTracing = "tracing"

// EnvServiceName names the OpenTelemetry environment variable that gives
// tracing.serviceName its default.
const EnvServiceName = "OTEL_SERVICE_NAME"

// Tracing configures the export of the consumers' spans (see the root
// package's tracing: a span per batch and per handler call, linked to the
// producers' spans) to an OpenTelemetry collector over OTLP/HTTP
// (protobuf). consumer run builds a tracer provider from it, with a batch
// span processor and a parent-based sampler of SampleRatio, and flushes it
// when it stops. Without this section (nil) nothing is traced, unless a
// binary built on consumercli gives a TracerProvider of its own.
//
// The standard OTEL_EXPORTER_OTLP_* environment variables apply to what
// the section leaves out (the endpoint, headers, certificates, timeouts,
// compression), so `tracing: {}` with OTEL_EXPORTER_OTLP_ENDPOINT set is
// enough; OTEL_RESOURCE_ATTRIBUTES adds to the resource.
type Tracing struct {
	// Endpoint is the collector's base URL, "http://collector:4318" or
	// https://, as OTEL_EXPORTER_OTLP_ENDPOINT takes it: spans are posted
	// to its path followed by /v1/traces. The scheme chooses TLS
	// (https, verified with the system's roots, or
	// OTEL_EXPORTER_OTLP_CERTIFICATE) or plain HTTP. Defaults to "": the
	// environment's (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
	// OTEL_EXPORTER_OTLP_ENDPOINT), else http://localhost:4318.
	Endpoint string `yaml:"endpoint"`

	// ServiceName is the service.name of the spans' resource. Defaults to
	// OTEL_SERVICE_NAME when set, else "pgevents-consumer".
	ServiceName string `yaml:"serviceName"`

	// SampleRatio is the share of batches traced, from 0 to 1: the root
	// sampler is TraceIDRatioBased(SampleRatio) under ParentBased, and a
	// handler's span follows its batch's. [Parse] sets 1 (every batch) when
	// the key is left out; 0 traces nothing but what a parent sampled.
	SampleRatio float64 `yaml:"sampleRatio"`

	// Headers are added to every export request (a collector's
	// credentials, say); when set they replace OTEL_EXPORTER_OTLP_HEADERS.
	// A value may name environment variables as ${NAME}, replaced when the
	// file is loaded.
	Headers map[string]string `yaml:"headers"`
}

// tracing decodes the tracing mapping v into c.Tracing.
func (p *parser) tracing(v *yaml.Node) *Error {
	t := &Tracing{SampleRatio: DefaultTracingSampleRatio}
	if isNull(v) { // "tracing:" alone: on, with every default
		p.cfg.Tracing = t
		return nil
	}
	if v.Kind != yaml.MappingNode {
		return &Error{Key: keyTracing, Line: p.lines[keyTracing], Msg: "must be a mapping (endpoint, serviceName, sampleRatio, headers), got " + describe(v)}
	}
	p.cfg.Tracing = t
	return p.mapping(v, keyTracing+".", func(name string, k, v *yaml.Node) *Error {
		key := keyTracing + "." + name
		var msg string
		switch name {
		case "endpoint":
			msg = decodeString(v, &t.Endpoint)
		case "serviceName":
			msg = decodeString(v, &t.ServiceName)
		case "sampleRatio":
			msg = decodeFloat(v, &t.SampleRatio)
		case "headers":
			return p.headers(key, k, v, &t.Headers)
		default:
			msg = "unknown key (endpoint, serviceName, sampleRatio, headers)"
		}
		if msg != "" {
			return &Error{Key: key, Line: k.Line, Msg: msg}
		}
		return nil
	})
}

// decodeFloat stores the number held by v in dst, or returns why it
// cannot.
func decodeFloat(v *yaml.Node, dst *float64) string {
	if v.Kind != yaml.ScalarNode || (v.ShortTag() != "!!float" && v.ShortTag() != "!!int") {
		return "must be a number, got " + describe(v)
	}
	f, err := strconv.ParseFloat(v.Value, 64)
	if err != nil {
		return "must be a number, got " + describe(v)
	}
	*dst = f
	return ""
}

// tracingProblems adds the problems of the tracing section.
func (c *Config) tracingProblems(add func(key, format string, args ...any)) {
	t := c.Tracing
	if t == nil {
		return
	}
	if t.Endpoint != "" {
		if _, err := t.TracesURL(); err != nil {
			add(keyTracing+".endpoint", "%v", err)
		}
	}
	if !(t.SampleRatio >= 0 && t.SampleRatio <= 1) { // NaN too
		add(keyTracing+".sampleRatio", "must be between 0 and 1, got %v", t.SampleRatio)
	}
	for name := range t.Headers {
		if name == "" || !validHeaderName(name) {
			add(keyTracing+".headers", "%q is not an HTTP header name", name)
		}
	}
}

// TracesURL returns the URL spans are posted to: Endpoint's path followed
// by /v1/traces. It fails when Endpoint is not an http:// or https:// URL
// with a host.
func (t *Tracing) TracesURL() (string, error) {
	u, err := url.Parse(t.Endpoint)
	switch {
	case err != nil:
		return "", fmt.Errorf("must be a URL such as \"http://collector:4318\", got %q", t.Endpoint)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("must be an http:// or https:// URL such as \"http://collector:4318\", got %q", t.Endpoint)
	case u.Host == "":
		return "", fmt.Errorf("must name the collector's host, got %q", t.Endpoint)
	case u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("must have no query or fragment, got %q", t.Endpoint)
	}
	u.Path = trimSlash(u.Path) + "/v1/traces"
	u.RawPath = ""
	return u.String(), nil
}

// Service returns the service.name of the spans: ServiceName, or
// OTEL_SERVICE_NAME when it is empty, or DefaultTracingServiceName.
func (t *Tracing) Service() string {
	if t.ServiceName != "" {
		return t.ServiceName
	}
	if n := os.Getenv(EnvServiceName); n != "" {
		return n
	}
	return DefaultTracingServiceName
}

func trimSlash(p string) string {
	for len(p) > 0 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	return p
}

// validHeaderName reports whether s is an HTTP header name (a token).
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c < 0x80 && isTokenPunct(c)) {
			return false
		}
	}
	return true
}

func isTokenPunct(c byte) bool {
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
