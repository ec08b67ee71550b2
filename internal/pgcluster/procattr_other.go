//go:build unix && !linux

package pgcluster

import "syscall"

// sysProcAttr puts postgres in its own process group and runs it as cred
// (nil: the current user). This system has no parent-death signal, so a
// cluster whose parent dies without calling Stop keeps running.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
