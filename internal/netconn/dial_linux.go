package netconn

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout is the Dialer's Control: it sets TCP_USER_TIMEOUT to
// UserTimeout on TCP sockets, so that data left unacknowledged for that long
// fails the connection. Other networks (Unix sockets) are left alone.
func setUserTimeout(network, address string, c syscall.RawConn) error {
	if network != "tcp" && network != "tcp4" && network != "tcp6" {
		return nil
	}
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(UserTimeout/time.Millisecond))
	})
	if err != nil {
		return err
	}
	return serr
}
