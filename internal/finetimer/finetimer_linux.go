//go:build linux

package finetimer

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// impl is a non-blocking timerfd, read through the runtime's poller.
type impl struct {
	fd  int
	f   *os.File // nil: the timerfd could not be had or failed
	buf [8]byte
}

func newImpl() impl {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return impl{fd: -1}
	}
	return impl{fd: fd, f: os.NewFile(uintptr(fd), "finetimer")}
}

// sleep arms the timerfd once and reads its expiry count; false when the
// timerfd is not usable (it is then given up, and time.Sleep serves).
func (t *impl) sleep(d time.Duration) bool {
	if t.f == nil {
		return false
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	if err := unix.TimerfdSettime(t.fd, 0, &spec, nil); err != nil {
		t.close()
		return false
	}
	if _, err := t.f.Read(t.buf[:]); err != nil {
		t.close()
		return false
	}
	return true
}

func (t *impl) close() {
	if t.f != nil {
		_ = t.f.Close()
		t.f = nil
	}
}
