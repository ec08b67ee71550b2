package config

import (
	"errors"
	"os"
	"path/filepath"
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
	c := mustParse(t, head+"console:\n  listen: 127.0.0.1:8080\n  token: 0123456789abcdef\n")
	if c.Console == nil || c.Console.Listen != "127.0.0.1:8080" || c.Warnings() != nil || c.Console.Token != "0123456789abcdef" || c.Console.ReadOnly {
		t.Errorf("Console = %+v", c.Console)
	}
	if c := mustParse(t, head+"console: {listen: ':0', readOnly: true}\n"); !c.Console.ReadOnly || c.Console.Token != "" {
		t.Errorf("read-only console without a token: %+v", c.Console)
	}

	if c := mustParse(t, head+"console: {listen: ':0', token: 0123456789abcdef}\n"); c.Console.PagesNeedToken || c.Console.AllowedHosts != nil || c.Console.TrustedProxies != nil {
		t.Errorf("defaults: pagesNeedToken false, no allowedHosts, no trustedProxies; got %+v", c.Console)
	}
	c = mustParse(t, head+"console:\n  listen: 127.0.0.1:8080\n  token: 0123456789abcdef\n  pagesNeedToken: true\n"+
		"  allowedHosts: [console.example.com, 'ops.example.com:443']\n  trustedProxies: [10.0.0.0/8, 192.0.2.1, '::1']\n")
	if !c.Console.PagesNeedToken || strings.Join(c.Console.AllowedHosts, ",") != "console.example.com,ops.example.com:443" ||
		strings.Join(c.Console.TrustedProxies, ",") != "10.0.0.0/8,192.0.2.1,::1" {
		t.Errorf("pagesNeedToken, allowedHosts, trustedProxies: %+v", c.Console)
	}
	if c := mustParse(t, head+"console: {listen: ':0', token: 0123456789abcdef, trustedProxies: 10.0.0.1}\n"); strings.Join(c.Console.TrustedProxies, ",") != "10.0.0.1" {
		t.Errorf("trustedProxies given as one address: %q", c.Console.TrustedProxies)
	}

	t.Setenv("MY_CONSOLE_TOKEN", "from-a-variable-0001")
	if c := mustParse(t, head+"console: {listen: ':0', token: '${MY_CONSOLE_TOKEN}'}\n"); c.Console.Token != "from-a-variable-0001" {
		t.Errorf("token from ${MY_CONSOLE_TOKEN} = %q", c.Console.Token)
	}
	t.Setenv(EnvConsoleToken, "from-the-environment-01")
	if c := mustParse(t, head+"console: {listen: ':0', token: short}\n"); c.Console.Token != "from-the-environment-01" {
		t.Errorf("%s must replace the file's token, got %q", EnvConsoleToken, c.Console.Token)
	}
	if c := mustParse(t, head+"console: {listen: ':0'}\n"); c.Console.Token != "from-the-environment-01" {
		t.Errorf("token from %s alone = %q", EnvConsoleToken, c.Console.Token)
	}
	if c := mustParse(t, head); c.Console != nil {
		t.Errorf("%s without a console section must not turn the console on: %+v", EnvConsoleToken, c.Console)
	}
	t.Setenv(EnvConsoleToken, "")

	for _, tt := range []struct{ src, key, msg string }{
		{"console: {token: 0123456789abcdef}\n", "console.listen", "required"},
		{"console: {listen: localhost, token: 0123456789abcdef}\n", "console.listen", "host:port"},
		{"console: {addr: localhost, token: 0123456789abcdef}\n", "console.addr", "host:port"},
		{"console: {listen: ':1', addr: ':2'}\n", "console.addr", "old name of console.listen"},
		{"console: {addr: ':1', listen: ':1'}\n", "console.addr", "old name of console.listen"},
		{"console: {listen: ':0', readOnly: yes please}\n", "console.readOnly", "true or false"},
		{"console: {listen: ':0', tokn: x}\n", "console.tokn", "unknown key"},
		{"console: [a]\n", "console", "mapping"},
		{"console: {listen: ':0', token: 0123456789abcdef, trustedProxies: [10.0.0.0/8, 10.0.0.0/33]}\n", "console.trustedProxies[1]", "CIDR"},
		{"console: {listen: ':0', token: 0123456789abcdef, trustedProxies: [proxy.example]}\n", "console.trustedProxies[0]", "IP address"},
		{"console: {listen: ':0', token: 0123456789abcdef, trustedProxies: {a: b}}\n", "console.trustedProxies", "list"},
		{"console: {listen: ':0', token: 0123456789abcdef, allowedHosts: ['https://console.example.com/']}\n", "console.allowedHosts[0]", "host name"},
		{"console: {listen: ':0', token: 0123456789abcdef, allowedHosts: ['']}\n", "console.allowedHosts[0]", "host name"},
		{"console: {listen: ':0', token: 0123456789abcdef, pagesNeedToken: 1}\n", "console.pagesNeedToken", "true or false"},
		{"console: {listen: ':0', readOnly: true, pagesNeedToken: true}\n", "console.pagesNeedToken", "readOnly"},
	} {
		e := parseErr(t, head+tt.src)
		if e.Key != tt.key || !strings.Contains(e.Msg, tt.msg) {
			t.Errorf("%q: error %v; want key %s and %q", tt.src, e, tt.key, tt.msg)
		}
	}
}

// TestConsoleAddrDeprecated: console.addr, the key's old name, is still
// read, with a warning that names the key, its line and the file (which
// the commands log at start); console.listen gives none.
func TestConsoleAddrDeprecated(t *testing.T) {
	clearEnv(t)
	const src = "databaseUrl: postgres://localhost/db\ngroupId: g\nconsole:\n  readOnly: true\n  addr: 127.0.0.1:8080\n"
	path := filepath.Join(t.TempDir(), "db-event-consumer.yml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Console.Listen != "127.0.0.1:8080" {
		t.Errorf("console.addr read as Listen %q", c.Console.Listen)
	}
	w := c.Warnings()
	if len(w) != 1 || w[0].Key != "console.addr" || w[0].Line != 5 || w[0].File != path || !strings.Contains(w[0].Msg, "console.listen") {
		t.Fatalf("Warnings() = %+v, want one naming console.addr at line 5 of %s and console.listen", w, path)
	}
	if s := w[0].String(); !strings.HasPrefix(s, "config "+path+": console.addr: is deprecated") || !strings.HasSuffix(s, "(line 5)") {
		t.Errorf("the warning reads %q", s)
	}
	if c := mustParse(t, strings.Replace(src, "addr:", "listen:", 1)); c.Warnings() != nil || c.Console.Listen != "127.0.0.1:8080" {
		t.Errorf("console.listen: Warnings() = %v, Listen %q", c.Warnings(), c.Console.Listen)
	}
	// A group copies the top level's settings, not its warnings.
	c = mustParse(t, strings.Replace(src, "groupId: g\n", "groups: [{groupId: a}, {groupId: b}]\n", 1))
	if len(c.Warnings()) != 1 || c.Groups[0].Warnings() != nil {
		t.Errorf("warnings: top level %v, group %v", c.Warnings(), c.Groups[0].Warnings())
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
		{"console: {listen: ':0'}\n", "no default"},
		{"console: {listen: ':0', token: secret}\n", "at least 16"},
		{"console: {listen: ':0', token: '${NOT_SET_ANYWHERE_XYZ}'}\n", "not set"},
	} {
		c := mustParse(t, head+tt.src)
		err := c.ConsoleError()
		var e *Error
		if !errors.As(err, &e) || e.Key != "console.token" || e.Line != 3 || !strings.Contains(e.Msg, tt.msg) {
			t.Errorf("%q: ConsoleError() = %v; want console.token at line 3 saying %q", tt.src, err, tt.msg)
		}
	}
	for _, src := range []string{"", "console: {listen: ':0', readOnly: true}\n", "console: {listen: ':0', token: 0123456789abcdef}\n"} {
		if err := mustParse(t, head+src).ConsoleError(); err != nil {
			t.Errorf("%q: ConsoleError() = %v, want nil", src, err)
		}
	}
	t.Setenv(EnvConsoleToken, "from-the-environment-01")
	if err := mustParse(t, head+"console: {listen: ':0', token: '${NOT_SET_ANYWHERE_XYZ}'}\n").ConsoleError(); err != nil {
		t.Errorf("%s replaces a token naming an unset variable: ConsoleError() = %v, want nil", EnvConsoleToken, err)
	}
}
