// Package netconn dials pgevents' connections: TCP keepalive and, on Linux,
// TCP_USER_TIMEOUT on every one, so that a peer that vanished is noticed in
// seconds whether the connection is idle or waiting for an answer.
package netconn

import (
	"context"
	"net"
	"time"
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

// Dial is a pgconn DialFunc that sets TCP keepalive and, on Linux,
// TCP_USER_TIMEOUT on the connection. Assign it to pgconn.Config.DialFunc.
func Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{
		Timeout: 10 * time.Second,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     KeepaliveIdle,
			Interval: KeepaliveInterval,
			Count:    KeepaliveCount,
		},
		Control: setUserTimeout,
	}
	return d.DialContext(ctx, network, addr)
}
