package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgevents/pgevents/kafka"
)

// TestParseKafka: the kafka section, its defaults, and the errors that
// name its keys.
func TestParseKafka(t *testing.T) {
	clearEnv(t)
	const head = "databaseUrl: postgres://localhost/db\ngroupId: g\n"

	if c := mustParse(t, head); c.Kafka != nil {
		t.Errorf("no kafka section: Kafka = %+v, want nil (off)", c.Kafka)
	}
	c := mustParse(t, head+"kafka:\n  topics: {events: 1}\n")
	k := c.Kafka
	if k == nil || k.Listen != ":9092" || k.AdvertisedAddr != "" || len(k.Topics) != 1 || k.Topics["events"] != 1 || k.ReadOnly ||
		k.Users != nil || k.TLS != nil || k.NodeID != 0 || k.MaxRequestBytes != kafka.DefaultMaxRequestBytes ||
		k.MaxWaitMs != 30000 || k.RequestTimeoutMs != 60000 {
		t.Fatalf("defaults: Kafka = %+v", k)
	}
	o, err := c.KafkaOptions()
	if err != nil || o.Listen != ":9092" || o.Topics["events"] != 1 || o.MaxWait != 30*time.Second || o.RequestTimeout != time.Minute ||
		o.MaxRequestBytes != kafka.DefaultMaxRequestBytes || o.TLS != nil || o.Users != nil {
		t.Fatalf("KafkaOptions() = %+v, %v", o, err)
	}

	c = mustParse(t, head+`kafka:
  listen: 0.0.0.0:19092
  advertisedAddr: kafka.internal:19092
  topics: {events: 1, orders.v1: 2}
  readOnly: true
  users: {alice: secret-a, bob: '${KAFKA_TEST_BOB}x'}
  nodeId: 3
  maxRequestBytes: 1048576
  maxWaitMs: 500
  requestTimeoutMs: 2000
`)
	k = c.Kafka
	if k.Listen != "0.0.0.0:19092" || k.AdvertisedAddr != "kafka.internal:19092" || k.Topics["orders.v1"] != 2 || !k.ReadOnly ||
		k.NodeID != 3 || k.MaxRequestBytes != 1<<20 || k.MaxWaitMs != 500 || k.RequestTimeoutMs != 2000 || k.Users["alice"] != "secret-a" {
		t.Errorf("Kafka = %+v", k)
	}
	// The unset variable is KafkaError's, naming the user and its line.
	var e *Error
	if err := c.KafkaError(); !errors.As(err, &e) || e.Key != "kafka.users.bob" || e.Line != 8 || !strings.Contains(e.Msg, "KAFKA_TEST_BOB") {
		t.Errorf("KafkaError() = %v, want kafka.users.bob (line 8) naming KAFKA_TEST_BOB", err)
	}
	t.Setenv("KAFKA_TEST_BOB", "from-env-")
	c = mustParse(t, head+"kafka:\n  topics: {events: 1}\n  users: {bob: '${KAFKA_TEST_BOB}x'}\n")
	if o, err := c.KafkaOptions(); err != nil || o.Users["bob"] != "from-env-x" {
		t.Errorf("password from ${KAFKA_TEST_BOB}: %+v, %v", o.Users, err)
	}
	if err := mustParse(t, head+"kafka:\n  topics: {events: 1}\n  users: {bob: ''}\n").KafkaError(); !errors.As(err, &e) || e.Key != "kafka.users.bob" {
		t.Errorf("empty password: KafkaError() = %v, want kafka.users.bob", err)
	}

	for _, tt := range []struct{ src, key, msg string }{
		{"kafka:\n", "kafka.topics", "required"},
		{"kafka: {topics: {}}\n", "kafka.topics", "required"},
		{"kafka: [a]\n", "kafka", "mapping"},
		{"kafka: {topics: [events]}\n", "kafka.topics", "mapping"},
		{"kafka: {topics: {'bad name!': 1}}\n", "kafka.topics.bad name!", "not a valid Kafka topic name"},
		{"kafka: {topics: {'..': 1}}\n", "kafka.topics...", "not a valid Kafka topic name"},
		{"kafka: {topics: {events: 0}}\n", "kafka.topics.events", "greater than 0"},
		{"kafka: {topics: {events: -1}}\n", "kafka.topics.events", "greater than 0"},
		{"kafka: {topics: {events: one}}\n", "kafka.topics.events", "integer"},
		{"kafka: {topics: {events: 1, again: 1}}\n", "kafka.topics.again", "as kafka.topics.events does"},
		{"kafka: {topics: {events: 1, again: 1, zzz: 1}}\n", "kafka.topics.again", "as kafka.topics.events does"},
		{"kafka: {topics: {events: 1}, listen: localhost}\n", "kafka.listen", "host:port"},
		{"kafka: {topics: {events: 1}, listen: ':kafka'}\n", "kafka.listen", "host:port"},
		{"kafka: {topics: {events: 1}, listen: ''}\n", "kafka.listen", "host:port"},
		{"kafka: {topics: {events: 1}, advertisedAddr: ':9092'}\n", "kafka.advertisedAddr", "host:port"},
		{"kafka: {topics: {events: 1}, nodeId: -1}\n", "kafka.nodeId", "between 0"},
		{"kafka: {topics: {events: 1}, maxRequestBytes: 0}\n", "kafka.maxRequestBytes", "between 1"},
		{"kafka: {topics: {events: 1}, maxWaitMs: 0}\n", "kafka.maxWaitMs", "between 1"},
		{"kafka: {topics: {events: 1}, requestTimeoutMs: -5}\n", "kafka.requestTimeoutMs", "between 1"},
		{"kafka: {topics: {events: 1}, readOnly: sure}\n", "kafka.readOnly", "true or false"},
		{"kafka: {topics: {events: 1}, users: [alice]}\n", "kafka.users", "mapping"},
		{"kafka: {topics: {events: 1}, tls: {certFile: c.pem}}\n", "kafka.tls.keyFile", "required"},
		{"kafka: {topics: {events: 1}, tls: {keyFile: k.pem}}\n", "kafka.tls.certFile", "required"},
		{"kafka: {topics: {events: 1}, tls: {}}\n", "kafka.tls.certFile", "required"},
		{"kafka: {topics: {events: 1}, tls: {caFile: ca.pem}}\n", "kafka.tls.caFile", "unknown key"},
		{"kafka: {topics: {events: 1}, maxWait: 5s}\n", "kafka.maxWait", "unknown key"},
		{"groups:\n  - groupId: a\n    kafka: {topics: {events: 1}}\n", "groups[0].kafka", "unknown key"},
	} {
		src := head + tt.src
		if strings.HasPrefix(tt.src, "groups:") {
			src = "databaseUrl: x\n" + tt.src
		}
		e := parseErr(t, src)
		if e.Key != tt.key || !strings.Contains(e.Msg, tt.msg) {
			t.Errorf("%q: error %v; want key %s and %q", tt.src, e, tt.key, tt.msg)
		}
	}
}

// TestKafkaTLS: the certificate and key load where the endpoint is served
// (KafkaError), and a file that is missing or holds no key names its key.
func TestKafkaTLS(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	cert, key := writeCert(t, dir)
	const head = "databaseUrl: x\ngroupId: g\nkafka:\n  topics: {events: 1}\n"
	c := mustParse(t, head+"  tls: {certFile: "+cert+", keyFile: "+key+"}\n")
	o, err := c.KafkaOptions()
	if err != nil || o.TLS == nil || len(o.TLS.Certificates) != 1 {
		t.Fatalf("KafkaOptions() = %+v, %v; want the certificate loaded", o.TLS, err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tt := range []struct{ cert, key, errKey, msg string }{
		{missing, key, "kafka.tls.certFile", "no such file"},
		{cert, missing, "kafka.tls.keyFile", "no such file"},
		{cert, cert, "kafka.tls.certFile", "keyFile"},
	} {
		c := mustParse(t, head+"  tls:\n    certFile: "+tt.cert+"\n    keyFile: "+tt.key+"\n")
		var e *Error
		if err := c.KafkaError(); !errors.As(err, &e) || e.Key != tt.errKey || e.Line == 0 || !strings.Contains(e.Msg, tt.msg) {
			t.Errorf("tls %s, %s: KafkaError() = %v; want %s with its line, saying %q", tt.cert, tt.key, err, tt.errKey, tt.msg)
		}
	}
}

// writeCert writes a self-signed certificate for localhost and its key.
func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}
