package console

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// parsePrefixes reads Options.TrustedProxies: each an IP address (one
// host) or a CIDR.
func parsePrefixes(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := parseTrustedProxy(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// parseTrustedProxy reads one entry of Options.TrustedProxies: an IP
// address ("10.0.0.7", "::1"), which stands for that one host, or a CIDR
// ("10.0.0.0/8").
func parseTrustedProxy(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an IP address or a CIDR such as 10.0.0.0/8", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address or a CIDR such as 10.0.0.0/8", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parseIP reads an address of RemoteAddr or X-Forwarded-For: "ip",
// "ip:port" or "[ip]:port".
func parseIP(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// trusted reports whether a is one of the trusted proxies.
func (c *Console) trusted(a netip.Addr) bool {
	for _, p := range c.proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientAddr is the address of the client the request comes from, the
// key of the sign-in limiter and the "from where" of the audit: the
// connecting peer (RemoteAddr), unless the peer is a trusted proxy
// (Options.TrustedProxies); then the right-most address of
// X-Forwarded-For that is not a trusted proxy, the one the nearest
// trusted proxy saw connect. Addresses left of it were written by the
// client and are not believed. A trusted peer whose X-Forwarded-For
// holds nothing usable is the client itself.
func (c *Console) clientAddr(r *http.Request) string {
	peer, ok := parseIP(r.RemoteAddr)
	if !ok {
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			return host
		}
		return r.RemoteAddr
	}
	if !c.trusted(peer) {
		return peer.String()
	}
	hops := r.Header.Values("X-Forwarded-For")
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		fields := strings.Split(hops[i], ",")
		for j := len(fields) - 1; j >= 0; j-- {
			if strings.TrimSpace(fields[j]) == "" {
				continue
			}
			a, ok := parseIP(fields[j])
			if !ok {
				return client.String() // a trusted proxy wrote no address here
			}
			if !c.trusted(a) {
				return a.String()
			}
			client = a
		}
	}
	return client.String()
}

// hostRule says which names the Host header of a request may give
// (Options.Addr and Options.AllowedHosts), so that a page of another site
// whose name was made to point at the console's address (DNS rebinding)
// gets nothing: the browser sends that site's name as Host.
type hostRule struct {
	names   map[string]bool // lower-case host names and IP addresses allowed
	anyIP   bool            // any IP address (the console listens on every one)
	anyLoop bool            // localhost and every loopback address
}

// newHostRule builds the rule of addr (Options.Addr) and the allowed
// names. An IP address in Host is not a name a DNS answer can change, so
// an address the console listens on passes; so do localhost and the
// loopback addresses when it listens on loopback, or on every address.
func newHostRule(addr string, allowed []string) (hostRule, error) {
	h := hostRule{names: map[string]bool{}}
	for _, n := range allowed {
		name, err := allowedHostName(n)
		if err != nil {
			return hostRule{}, err
		}
		h.names[name] = true
	}
	host := addr
	if addr != "" {
		var err error
		if host, _, err = net.SplitHostPort(addr); err != nil {
			return hostRule{}, fmt.Errorf("Addr %q: must be host:port or :port", addr)
		}
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	ip, isIP := parseIP(host)
	switch {
	case host == "" || isIP && ip.IsUnspecified():
		h.anyIP, h.anyLoop = true, true
	case host == "localhost" || isIP && ip.IsLoopback():
		h.anyLoop = true
		h.names[host] = true
	case isIP:
		h.names[ip.String()] = true
	default:
		h.names[host] = true
	}
	return h, nil
}

// allowedHostName reads one entry of Options.AllowedHosts: a host name
// or an IP address, with or without a port (which is not compared); it
// returns the name, lower-case.
func allowedHostName(s string) (string, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	if strings.ContainsAny(name, "/\\@?# \t") {
		return "", fmt.Errorf("%q is not a host name (such as console.example.com)", s)
	}
	if h, _, err := net.SplitHostPort(name); err == nil {
		name = h
	}
	if name = strings.Trim(name, "[]"); name == "" {
		return "", fmt.Errorf("%q is not a host name (such as console.example.com)", s)
	}
	if ip, ok := parseIP(name); ok {
		return ip.String(), nil
	}
	return name, nil
}

// allows reports whether the request's Host may be served.
func (h hostRule) allows(hostHeader string) bool {
	name := strings.ToLower(hostHeader)
	if hn, _, err := net.SplitHostPort(name); err == nil {
		name = hn
	}
	name = strings.TrimSuffix(strings.Trim(name, "[]"), ".")
	if name == "" {
		return false
	}
	if ip, ok := parseIP(name); ok {
		return h.anyIP || h.anyLoop && ip.IsLoopback() || h.names[ip.String()]
	}
	return h.names[name] || h.anyLoop && name == "localhost"
}
