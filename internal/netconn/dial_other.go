//go:build !linux

package netconn

import "syscall"

// setUserTimeout is the Dialer's Control. TCP_USER_TIMEOUT exists only on
// Linux; elsewhere the connection relies on TCP keepalive and the canary.
func setUserTimeout(network, address string, c syscall.RawConn) error {
	return nil
}
