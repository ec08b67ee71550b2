package config

import (
	"errors"
	"strings"
	"testing"
)

// TestParseConsole: the console section, its defaults, its environment
// override, and the errors that name its keys. There is no default token.
func TestParseConsole(t *testing.T) {
	clearEnv(t)
	t.Setenv(EnvConsoleToken, "")
	const head = "databaseUrl: postgres://localhost/db\ngroupId: g\n"

	if c := mustParse(t, head); c.Console != nil {
		t.Errorf("no console section: Console = %+v, want nil (off)", c.Console)
	}
	c := mustParse(t, head+"console:\n  addr: 127.0.0.1:8080\n  token: 0123456789abcdef\n")
	if c.Console == nil || c.Console.Addr != "127.0.0.1:8080" || c.Console.Token != "0123456789abcdef" || c.Console.ReadOnly {
		t.Errorf("Console = %+v", c.Console)
	}
	if c := mustParse(t, head+"console: {addr: ':0', readOnly: true}\n"); !c.Console.ReadOnly || c.Console.Token != "" {
		t.Errorf("read-only console without a token: %+v", c.Console)
	}

	if c := mustParse(t, head+"console: {addr: ':0', token: 0123456789abcdef}\n"); c.Console.PagesNeedToken || c.Console.AllowedHosts != nil || c.Console.TrustedProxies != nil {
		t.Errorf("defaults: pagesNeedToken false, no allowedHosts, no trustedProxies; got %+v", c.Console)
	}
	c = mustParse(t, head+"console:\n  addr: 127.0.0.1:8080\n  token: 0123456789abcdef\n  pagesNeedToken: true\n"+
		"  allowedHosts: [console.example.com, 'ops.example.com:443']\n  trustedProxies: [10.0.0.0/8, 192.0.2.1, '::1']\n")
	if !c.Console.PagesNeedToken || strings.Join(c.Console.AllowedHosts, ",") != "console.example.com,ops.example.com:443" ||
		strings.Join(c.Console.TrustedProxies, ",") != "10.0.0.0/8,192.0.2.1,::1" {
		t.Errorf("pagesNeedToken, allowedHosts, trustedProxies: %+v", c.Console)
	}
	if c := mustParse(t, head+"console: {addr: ':0', token: 0123456789abcdef, trustedProxies: 10.0.0.1}\n"); strings.Join(c.Console.TrustedProxies, ",") != "10.0.0.1" {
		t.Errorf("trustedProxies given as one address: %q", c.Console.TrustedProxies)
	}

	t.Setenv("MY_CONSOLE_TOKEN", "from-a-variable-0001")
	if c := mustParse(t, head+"console: {addr: ':0', token: '${MY_CONSOLE_TOKEN}'}\n"); c.Console.Token != "from-a-variable-0001" {
		t.Errorf("token from ${MY_CONSOLE_TOKEN} = %q", c.Console.Token)
	}
	t.Setenv(EnvConsoleToken, "from-the-environment-01")
	if c := mustParse(t, head+"console: {addr: ':0', token: short}\n"); c.Console.Token != "from-the-environment-01" {
		t.Errorf("%s must replace the file's token, got %q", EnvConsoleToken, c.Console.Token)
	}
	if c := mustParse(t, head+"console: {addr: ':0'}\n"); c.Console.Token != "from-the-environment-01" {
		t.Errorf("token from %s alone = %q", EnvConsoleToken, c.Console.Token)
	}
	if c := mustParse(t, head); c.Console != nil {
		t.Errorf("%s without a console section must not turn the console on: %+v", EnvConsoleToken, c.Console)
	}
	t.Setenv(EnvConsoleToken, "")

	for _, tt := range []struct{ src, key, msg string }{
		{"console: {token: 0123456789abcdef}\n", "console.addr", "required"},
		{"console: {addr: localhost, token: 0123456789abcdef}\n", "console.addr", "host:port"},
		{"console: {addr: ':0', readOnly: yes please}\n", "console.readOnly", "true or false"},
		{"console: {addr: ':0', tokn: x}\n", "console.tokn", "unknown key"},
		{"console: [a]\n", "console", "mapping"},
		{"console: {addr: ':0', token: 0123456789abcdef, trustedProxies: [10.0.0.0/8, 10.0.0.0/33]}\n", "console.trustedProxies[1]", "CIDR"},
		{"console: {addr: ':0', token: 0123456789abcdef, trustedProxies: [proxy.example]}\n", "console.trustedProxies[0]", "IP address"},
		{"console: {addr: ':0', token: 0123456789abcdef, trustedProxies: {a: b}}\n", "console.trustedProxies", "list"},
		{"console: {addr: ':0', token: 0123456789abcdef, allowedHosts: ['https://console.example.com/']}\n", "console.allowedHosts[0]", "host name"},
		{"console: {addr: ':0', token: 0123456789abcdef, allowedHosts: ['']}\n", "console.allowedHosts[0]", "host name"},
		{"console: {addr: ':0', token: 0123456789abcdef, pagesNeedToken: 1}\n", "console.pagesNeedToken", "true or false"},
		{"console: {addr: ':0', readOnly: true, pagesNeedToken: true}\n", "console.pagesNeedToken", "readOnly"},
	} {
		e := parseErr(t, head+tt.src)
		if e.Key != tt.key || !strings.Contains(e.Msg, tt.msg) {
			t.Errorf("%q: error %v; want key %s and %q", tt.src, e, tt.key, tt.msg)
		}
	}
}

// TestConsoleError: the token rules are ConsoleError's, which the commands
// that serve the console call; Parse accepts a file whose console lacks a
// usable token, for the commands that never serve it. The error names
// console.token and its line.
func TestConsoleError(t *testing.T) {
	clearEnv(t)
	t.Setenv(EnvConsoleToken, "")
	const head = "databaseUrl: postgres://localhost/db\ngroupId: g\n"
	for _, tt := range []struct{ src, msg string }{
		{"console: {addr: ':0'}\n", "no default"},
		{"console: {addr: ':0', token: secret}\n", "at least 16"},
		{"console: {addr: ':0', token: '${NOT_SET_ANYWHERE_XYZ}'}\n", "not set"},
	} {
		c := mustParse(t, head+tt.src)
		err := c.ConsoleError()
		var e *Error
		if !errors.As(err, &e) || e.Key != "console.token" || e.Line != 3 || !strings.Contains(e.Msg, tt.msg) {
			t.Errorf("%q: ConsoleError() = %v; want console.token at line 3 saying %q", tt.src, err, tt.msg)
		}
	}
	for _, src := range []string{"", "console: {addr: ':0', readOnly: true}\n", "console: {addr: ':0', token: 0123456789abcdef}\n"} {
		if err := mustParse(t, head+src).ConsoleError(); err != nil {
			t.Errorf("%q: ConsoleError() = %v, want nil", src, err)
		}
	}
	t.Setenv(EnvConsoleToken, "from-the-environment-01")
	if err := mustParse(t, head+"console: {addr: ':0', token: '${NOT_SET_ANYWHERE_XYZ}'}\n").ConsoleError(); err != nil {
		t.Errorf("%s replaces a token naming an unset variable: ConsoleError() = %v, want nil", EnvConsoleToken, err)
	}
}
