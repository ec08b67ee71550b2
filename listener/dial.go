package listener

import (
	"context"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Keepalive settings for every pgevents connection: a peer that vanished
// (power loss, partition, half-open TCP) is noticed within about
// KeepaliveIdle + KeepaliveCount*KeepaliveInterval when idle, and within
// UserTimeout when data is unacknowledged.
const (
	KeepaliveIdle     = 5 * time.Second
	KeepaliveInterval = time.Second
	KeepaliveCount    = 3
	UserTimeout       = 10 * time.Second
)

// Dial is a pgconn DialFunc that sets TCP keepalive and TCP_USER_TIMEOUT on
// the connection. Assign it to pgconn.Config.DialFunc.
func Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{
		Timeout: 10 * time.Second,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     KeepaliveIdle,
			Interval: KeepaliveInterval,
			Count:    KeepaliveCount,
		},
		Control: func(network, address string, c syscall.RawConn) error {
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
		},
	}
	return d.DialContext(ctx, network, addr)
}
