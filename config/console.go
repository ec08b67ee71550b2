package config

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// EnvConsoleToken names the environment variable that replaces
// console.token, so that the credential need not sit in the file.
const EnvConsoleToken = "PGEVENTS_CONSOLE_TOKEN"

// MinConsoleTokenLen is the shortest console.token accepted: there is no
// default token, and a short one is guessed.
const MinConsoleTokenLen = 16

const keyConsole = "console"

// consoleKeys are the keys of the console section, for error messages.
const consoleKeys = "listen, token, readOnly, pagesNeedToken, allowedHosts, trustedProxies"

// decodeStrings reads a list of strings (what names its items), or a
// single string as a list of one; it returns why it cannot.
func decodeStrings(v *yaml.Node, what string) ([]string, string) {
	if isNull(v) {
		return nil, ""
	}
	if v.Kind == yaml.ScalarNode {
		return []string{v.Value}, ""
	}
	if v.Kind != yaml.SequenceNode {
		return nil, "must be a list of " + what + ", got " + describe(v)
	}
	out := make([]string, 0, len(v.Content))
	for i, item := range v.Content {
		var s string
		if msg := decodeString(resolve(item), &s); msg != "" {
			return nil, fmt.Sprintf("item %d: %s", i, msg)
		}
		out = append(out, s)
	}
	return out, ""
}

// Console configures the operator console (package console): served by
// `consumer console`, and by `consumer run` beside the consumers when the
// file has this section. Without it no console is served.
type Console struct {
	// Listen is the address the console listens on, "host:port" or
	// ":port"; required. Pages are readable by anyone who reaches it: bind
	// it to a private address. The key was named addr before, as the
	// Kafka endpoint's is kafka.listen: a file that still says
	// console.addr is read, with a warning (see [Config.Warnings]).
	Listen string `yaml:"listen"`

	// Token is the credential for actions (a reset, a pause, a replay...):
	// operators type it in the sign-in form, scripts send it as
	// "Authorization: Bearer TOKEN". The environment variable
	// PGEVENTS_CONSOLE_TOKEN replaces it when set and non-empty, and the
	// file's value may name environment variables as ${NAME}. There is no
	// default: required, at least MinConsoleTokenLen characters, unless
	// ReadOnly. These rules are checked where the console is served (see
	// [Config.ConsoleError]), not by Load: a command that never serves it
	// runs where the token is not given.
	Token string `yaml:"token"`

	// ReadOnly serves the pages without actions: no form changes anything,
	// and every action request is refused. Defaults to false.
	ReadOnly bool `yaml:"readOnly"`

	// PagesNeedToken puts every page behind the token, not only the
	// actions: without a session or the bearer token a page answers 401.
	// Defaults to false: anyone who reaches Addr reads the pages, payloads
	// and errors included. It needs the token, so not with ReadOnly.
	PagesNeedToken bool `yaml:"pagesNeedToken"`

	// AllowedHosts are the names, besides Addr's host (and localhost when
	// Addr is a loopback or every address), that a request's Host header
	// may give: the name operators reach the console by, directly or
	// through a proxy. Any other Host gets 421, which stops a page of
	// another site whose name was made to resolve to the console's address
	// (DNS rebinding). A port, if given, is not compared. Defaults to none.
	AllowedHosts []string `yaml:"allowedHosts"`

	// TrustedProxies are the proxies in front of the console, each an IP
	// address or a CIDR ("10.0.0.0/8"): from one of them, the client's
	// address (what the limit of five wrong tokens a minute counts, and
	// the audit shows) is the right-most address of X-Forwarded-For that
	// is not a trusted proxy's. Defaults to none: X-Forwarded-For is
	// ignored, and behind a proxy every client has the proxy's address.
	TrustedProxies []string `yaml:"trustedProxies"`

	// listenKey is the key the file gave the address under: "listen",
	// or "addr" (deprecated); what the problems of the address name.
	listenKey string
	// tokenErr is why the file's token could not be read (a ${NAME} that
	// is not set), for ConsoleError.
	tokenErr string
	// tokenLine is the line of console.token in the file, or of console.
	tokenLine int
}

// console decodes the console mapping v into c.Console.
func (p *parser) console(v *yaml.Node) *Error {
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.MappingNode {
		return &Error{Key: keyConsole, Line: p.lines[keyConsole], Msg: "must be a mapping (" + consoleKeys + "), got " + describe(v)}
	}
	c := &Console{listenKey: "listen"}
	p.cfg.Console = c
	return p.mapping(v, keyConsole+".", func(name string, k, v *yaml.Node) *Error {
		key := keyConsole + "." + name
		var msg string
		switch name {
		case "listen", "addr":
			if other := map[string]string{"listen": "addr", "addr": "listen"}[name]; p.lines[keyConsole+"."+other] != 0 {
				return &Error{Key: keyConsole + ".addr", Line: p.lines[keyConsole+".addr"],
					Msg: "is the old name of console.listen, which the file gives too: keep console.listen only"}
			}
			msg = decodeString(v, &c.Listen)
			c.listenKey = name
			if name == "addr" {
				p.warn(key, k.Line, "is deprecated: name it console.listen (as kafka.listen); console.addr is still read")
			}
		case "token":
			if msg = decodeString(v, &c.Token); msg == "" {
				var err error
				if c.Token, err = expandEnv(c.Token); err != nil {
					c.tokenErr = err.Error() // for ConsoleError: only serving needs it
				}
			}
		case "readOnly":
			msg = decodeBool(v, &c.ReadOnly)
		case "pagesNeedToken":
			msg = decodeBool(v, &c.PagesNeedToken)
		case "allowedHosts":
			c.AllowedHosts, msg = decodeStrings(v, "host names")
		case "trustedProxies":
			c.TrustedProxies, msg = decodeStrings(v, "IP addresses or CIDRs")
		default:
			msg = "unknown key (" + consoleKeys + ")"
		}
		if msg != "" {
			return &Error{Key: key, Line: k.Line, Msg: msg}
		}
		return nil
	})
}

// consoleEnv applies PGEVENTS_CONSOLE_TOKEN to a configured console.
func (c *Config) consoleEnv() {
	if tok := os.Getenv(EnvConsoleToken); tok != "" && c.Console != nil {
		c.Console.Token, c.Console.tokenErr = tok, ""
	}
}

// consoleProblems adds the problems of the console section, but for its
// token (see ConsoleError).
func (c *Config) consoleProblems(add func(key, format string, args ...any)) {
	k := c.Console
	if k == nil {
		return
	}
	listen := keyConsole + "." + cmp.Or(k.listenKey, "listen")
	if k.Listen == "" {
		add(listen, "is required: the address to serve the console on, host:port")
	} else if _, port, err := net.SplitHostPort(k.Listen); err != nil || port == "" {
		add(listen, "must be host:port or :port, got %q", k.Listen)
	}
	if k.ReadOnly && k.PagesNeedToken {
		add(keyConsole+".pagesNeedToken", "needs the token, which a readOnly console does not take: set one of them")
	}
	for i, h := range k.AllowedHosts {
		if !validHostName(h) {
			add(fmt.Sprintf("%s.allowedHosts[%d]", keyConsole, i), "must be a host name such as console.example.com (a port is allowed), got %q", h)
		}
	}
	for i, p := range k.TrustedProxies {
		if !validProxy(p) {
			add(fmt.Sprintf("%s.trustedProxies[%d]", keyConsole, i), "must be an IP address or a CIDR such as 10.0.0.0/8, got %q", p)
		}
	}
}

// validHostName reports whether s is a host name or IP address, with or
// without a port, as the console compares the Host header with.
func validHostName(s string) bool {
	name := strings.TrimSpace(s)
	if strings.ContainsAny(name, "/\\@?# \t") {
		return false
	}
	if h, _, err := net.SplitHostPort(name); err == nil {
		name = h
	}
	return strings.Trim(name, "[]") != ""
}

// validProxy reports whether s is an IP address or a CIDR.
func validProxy(s string) bool {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		_, err := netip.ParsePrefix(s)
		return err == nil
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

// ConsoleError reports what keeps the console section from being served:
// an [*Error] naming console.token (and its line, in a file Load read)
// when the token is missing (and not ReadOnly), shorter than
// MinConsoleTokenLen characters, or names an environment variable that is
// not set. Load, Parse and Validate leave the token to the commands that
// serve the console (`consumer run` with a console section, `consumer
// console`), which call ConsoleError before they start: the others
// (migrate, status, dlq...) run where the console's token is not given.
// Nil without a console section.
func (c *Config) ConsoleError() error {
	k := c.Console
	if k == nil || k.ReadOnly {
		return nil
	}
	e := &Error{Key: keyConsole + ".token", Line: k.tokenLine}
	switch n := len([]rune(k.Token)); {
	case k.tokenErr != "":
		e.Msg = k.tokenErr
	case n == 0:
		e.Msg = fmt.Sprintf("is required to serve the console (or readOnly: true): set it, or the %s environment variable; there is no default", EnvConsoleToken)
	case n < MinConsoleTokenLen:
		e.Msg = fmt.Sprintf("must be at least %d characters, got %d", MinConsoleTokenLen, n)
	default:
		return nil
	}
	return e
}
