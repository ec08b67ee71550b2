package config

import (
	"crypto/tls"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"slices"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/pgevents/pgevents/kafka"
)

const keyKafka = "kafka"

// kafkaKeys are the keys of the kafka section, for error messages.
const kafkaKeys = "listen, advertisedAddr, topics, readOnly, users, tls, nodeId, maxRequestBytes, maxWaitMs, requestTimeoutMs"

// Kafka configures the Kafka protocol endpoint (package kafka): Kafka
// clients read the topics it names, commit offsets as pgevents groups and
// produce events, over the top level's database and schema. Served by
// `consumer kafka`, and by `consumer run` beside the consumers when the
// file has this section. Without it no endpoint is served.
type Kafka struct {
	// Listen is the address the endpoint listens on, "host:port" or
	// ":port". Defaults to ":9092" (DefaultKafkaListen).
	Listen string `yaml:"listen"`

	// AdvertisedAddr is the "host:port" clients are told to connect to
	// (in Metadata and FindCoordinator): the address they reach the
	// endpoint by. Defaults to "": the listener's address, with the host
	// "localhost" when it listens on every interface.
	AdvertisedAddr string `yaml:"advertisedAddr"`

	// Topics maps each Kafka topic name served to the pgevents topic id
	// behind it ({events: 1}). Required: at least one. A name must be a
	// valid Kafka topic name (kafka.ValidTopicName), an id greater than 0,
	// and two names may not share an id.
	Topics map[string]int `yaml:"topics"`

	// ReadOnly refuses produce requests: clients only read and commit
	// offsets. Defaults to false.
	ReadOnly bool `yaml:"readOnly"`

	// Users, when set, require SASL/PLAIN authentication: user name to
	// password. A password may name environment variables as ${NAME}; like
	// console.token, it is checked only where the endpoint is served
	// ([Config.KafkaError]). Without TLS passwords travel in clear.
	// Defaults to none: no authentication.
	Users map[string]string `yaml:"users"`

	// TLS, when set, serves TLS with the certificate and key it names
	// (both required). Defaults to none: plaintext.
	TLS *KafkaTLS `yaml:"tls"`

	// NodeID is the broker id the endpoint reports; endpoints that serve
	// the same database need distinct ids. Defaults to 0.
	NodeID int `yaml:"nodeId"`

	// MaxRequestBytes bounds a request: a larger one closes the
	// connection. Defaults to 16777216 (DefaultKafkaMaxRequestBytes).
	MaxRequestBytes int `yaml:"maxRequestBytes"`

	// MaxWaitMs bounds, in milliseconds, how long a fetch waits for
	// events, whatever the client asks. Defaults to 30000.
	MaxWaitMs int `yaml:"maxWaitMs"`

	// RequestTimeoutMs bounds, in milliseconds, a request's database work.
	// Defaults to 60000.
	RequestTimeoutMs int `yaml:"requestTimeoutMs"`

	// userErrs are why a user's password could not be read (a ${NAME}
	// that is not set), by user, for KafkaError; lines are the lines of
	// the section's keys, for its errors.
	userErrs map[string]string
	lines    map[string]int
	// order is the topics' names in the file's order, so that of two
	// names of one topic the second is blamed.
	order []string
}

// KafkaTLS names the PEM files of the Kafka endpoint's TLS server
// configuration.
type KafkaTLS struct {
	// CertFile holds the server's certificate (chain); KeyFile its
	// private key. Both are required.
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
}

// defaultKafka returns a kafka section holding every default.
func defaultKafka() *Kafka {
	return &Kafka{
		Listen:           DefaultKafkaListen,
		MaxRequestBytes:  DefaultKafkaMaxRequestBytes,
		MaxWaitMs:        DefaultKafkaMaxWaitMs,
		RequestTimeoutMs: DefaultKafkaRequestTimeoutMs,
	}
}

// kafka decodes the kafka mapping v into c.Kafka. "kafka:" alone is the
// section with every default (and no topics, which is refused).
func (p *parser) kafka(v *yaml.Node) *Error {
	k := defaultKafka()
	p.cfg.Kafka = k
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.MappingNode {
		return &Error{Key: keyKafka, Line: p.lines[keyKafka], Msg: "must be a mapping (" + kafkaKeys + "), got " + describe(v)}
	}
	return p.mapping(v, keyKafka+".", func(name string, kn, v *yaml.Node) *Error {
		key := keyKafka + "." + name
		var msg string
		switch name {
		case "listen":
			msg = decodeString(v, &k.Listen)
		case "advertisedAddr":
			msg = decodeString(v, &k.AdvertisedAddr)
		case "topics":
			if isNull(v) {
				k.Topics = nil
				break
			}
			if v.Kind != yaml.MappingNode {
				msg = "must be a mapping of Kafka topic names to pgevents topic ids, such as {events: 1}, got " + describe(v)
				break
			}
			k.Topics = map[string]int{}
			return p.mapping(v, key+".", func(topic string, tk, tv *yaml.Node) *Error {
				var id int
				if msg := decodeInt(tv, &id); msg != "" {
					return &Error{Key: key + "." + topic, Line: tk.Line, Msg: msg + " (a pgevents topic id)"}
				}
				k.Topics[topic] = id
				k.order = append(k.order, topic)
				return nil
			})
		case "readOnly":
			msg = decodeBool(v, &k.ReadOnly)
		case "users":
			if isNull(v) {
				k.Users = nil
				break
			}
			if v.Kind != yaml.MappingNode {
				msg = "must be a mapping of user names to passwords, got " + describe(v)
				break
			}
			k.Users = map[string]string{}
			return p.mapping(v, key+".", func(user string, uk, uv *yaml.Node) *Error {
				var pw string
				if msg := decodeString(uv, &pw); msg != "" {
					return &Error{Key: key + "." + user, Line: uk.Line, Msg: msg}
				}
				expanded, err := expandEnv(pw)
				if err != nil {
					if k.userErrs == nil {
						k.userErrs = map[string]string{}
					}
					k.userErrs[user] = err.Error() // for KafkaError: only serving needs it
				}
				k.Users[user] = expanded
				return nil
			})
		case "tls":
			if v.Kind != yaml.MappingNode && !isNull(v) {
				msg = "must be a mapping (certFile, keyFile), got " + describe(v)
				break
			}
			k.TLS = &KafkaTLS{}
			if isNull(v) {
				return nil
			}
			return p.subFields(v, key, map[string]*string{"certFile": &k.TLS.CertFile, "keyFile": &k.TLS.KeyFile}, nil)
		case "nodeId":
			msg = decodeInt(v, &k.NodeID)
		case "maxRequestBytes":
			msg = decodeInt(v, &k.MaxRequestBytes)
		case "maxWaitMs":
			msg = decodeInt(v, &k.MaxWaitMs)
		case "requestTimeoutMs":
			msg = decodeInt(v, &k.RequestTimeoutMs)
		default:
			msg = "unknown key (" + kafkaKeys + ")"
		}
		if msg != "" {
			return &Error{Key: key, Line: kn.Line, Msg: msg}
		}
		return nil
	})
}

// kafkaLines records, in a parsed kafka section, the lines of the keys
// KafkaError names.
func (p *parser) kafkaLines() {
	k := p.cfg.Kafka
	if k == nil {
		return
	}
	k.lines = map[string]int{}
	for _, key := range []string{"tls", "tls.certFile", "tls.keyFile"} {
		k.lines[key] = p.lineOf(keyKafka + "." + key)
	}
	for user := range k.Users {
		k.lines["users."+user] = p.lineOf(keyKafka + ".users." + user)
	}
}

// kafkaProblems adds the problems of the kafka section, but for its
// credentials and TLS files (see KafkaError).
func (c *Config) kafkaProblems(add func(key, format string, args ...any)) {
	k := c.Kafka
	if k == nil {
		return
	}
	if !validListenAddr(k.Listen) {
		add(keyKafka+".listen", "must be host:port or :port, got %q", k.Listen)
	}
	if k.AdvertisedAddr != "" {
		if host, _, err := net.SplitHostPort(k.AdvertisedAddr); err != nil || host == "" || !validListenAddr(k.AdvertisedAddr) {
			add(keyKafka+".advertisedAddr", "must be host:port, the address clients reach the endpoint by, got %q", k.AdvertisedAddr)
		}
	}
	if len(k.Topics) == 0 {
		add(keyKafka+".topics", "is required: the Kafka topic names served and the pgevents topic behind each, such as {events: 1}")
	}
	order := k.order
	if len(order) != len(k.Topics) { // built in Go
		order = slices.Sorted(maps.Keys(k.Topics))
	}
	first := map[int]string{} // topic id -> its first name
	for _, name := range order {
		id := k.Topics[name]
		key := keyKafka + ".topics." + name
		if err := kafka.ValidTopicName(name); err != nil {
			add(key, "%v", err)
		}
		switch other, dup := first[id]; {
		case id <= 0:
			add(key, "must be a pgevents topic id, greater than 0, got %d", id)
		case dup:
			add(key, "names topic %d, as %s.topics.%s does: a pgevents topic has one Kafka name", id, keyKafka, other)
		default:
			first[id] = name
		}
	}
	for user := range k.Users {
		if user == "" {
			add(keyKafka+".users", "a user name must not be empty")
		}
	}
	if k.NodeID < 0 || k.NodeID > math.MaxInt32 {
		add(keyKafka+".nodeId", "must be between 0 and %d, got %d", math.MaxInt32, k.NodeID)
	}
	if k.MaxRequestBytes <= 0 || k.MaxRequestBytes > math.MaxInt32 {
		add(keyKafka+".maxRequestBytes", "must be between 1 and %d, got %d", math.MaxInt32, k.MaxRequestBytes)
	}
	for key, v := range map[string]int{"maxWaitMs": k.MaxWaitMs, "requestTimeoutMs": k.RequestTimeoutMs} {
		if v <= 0 || v > maxMillis {
			add(keyKafka+"."+key, "must be between 1 and %d, got %d", maxMillis, v)
		}
	}
	if t := k.TLS; t != nil {
		switch {
		case t.CertFile == "" && t.KeyFile == "":
			add(keyKafka+".tls.certFile", "is required with tls: the server's certificate (PEM), with keyFile its key")
		case t.KeyFile == "":
			add(keyKafka+".tls.keyFile", "is required with certFile: the certificate's private key (PEM)")
		case t.CertFile == "":
			add(keyKafka+".tls.certFile", "is required with keyFile: the server's certificate (PEM)")
		}
	}
}

// validListenAddr reports whether s is host:port or :port with a numeric
// port.
func validListenAddr(s string) bool {
	_, port, err := net.SplitHostPort(s)
	if err != nil || port == "" {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}

// KafkaError reports what keeps the kafka section from being served: an
// [*Error] naming kafka.users.NAME when a password is empty or names an
// environment variable that is not set, or kafka.tls.certFile (or
// keyFile) when the files cannot be read or do not hold a certificate and
// its key. Load, Parse and Validate leave these to the commands that serve
// the endpoint (`consumer run` with a kafka section, `consumer kafka`),
// which call KafkaError before they start: the others run where the
// secrets are not given. Nil without a kafka section.
func (c *Config) KafkaError() error {
	_, err := c.KafkaOptions()
	return err
}

// KafkaOptions returns the options of the endpoint the kafka section
// configures: the one place where its keys become kafka.Options, with the
// users' passwords and the TLS certificate loaded. Its errors are
// KafkaError's. The caller adds the Logger. The zero Options without a
// kafka section.
func (c *Config) KafkaOptions() (kafka.Options, error) {
	k := c.Kafka
	if k == nil {
		return kafka.Options{}, nil
	}
	for _, user := range slices.Sorted(maps.Keys(k.Users)) {
		e := &Error{Key: keyKafka + ".users." + user, Line: k.lines["users."+user]}
		switch {
		case k.userErrs[user] != "":
			e.Msg = k.userErrs[user]
		case k.Users[user] == "":
			e.Msg = "the password must not be empty"
		default:
			continue
		}
		return kafka.Options{}, e
	}
	o := kafka.Options{
		Listen:          k.Listen,
		AdvertisedAddr:  k.AdvertisedAddr,
		Topics:          k.Topics,
		ReadOnly:        k.ReadOnly,
		Users:           k.Users,
		NodeID:          int32(k.NodeID),
		MaxRequestBytes: int32(k.MaxRequestBytes),
		MaxWait:         millis(k.MaxWaitMs),
		RequestTimeout:  millis(k.RequestTimeoutMs),
	}
	if k.TLS != nil {
		cfg, err := k.TLS.config(k.lines)
		if err != nil {
			return kafka.Options{}, err
		}
		o.TLS = cfg
	}
	return o, nil
}

// config loads the certificate and key into a TLS server configuration
// (TLS 1.2 or later), or returns an *Error naming the file that fails.
func (t *KafkaTLS) config(lines map[string]int) (*tls.Config, error) {
	fail := func(key, msg string) error {
		return &Error{Key: keyKafka + ".tls." + key, Line: lines["tls."+key], Msg: msg}
	}
	for _, f := range []struct{ key, path string }{{"certFile", t.CertFile}, {"keyFile", t.KeyFile}} {
		if f.path == "" {
			return nil, fail(f.key, "is required with tls")
		}
		if _, err := os.Stat(f.path); err != nil {
			return nil, fail(f.key, fmt.Sprintf("cannot read %s: %v", f.path, pathErr(err)))
		}
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fail("certFile", fmt.Sprintf("%s with keyFile %s: %v", t.CertFile, t.KeyFile, err))
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}

// pathErr returns the cause of an *fs.PathError, whose path the message
// gives already.
func pathErr(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
