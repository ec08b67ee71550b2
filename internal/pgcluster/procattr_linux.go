package pgcluster

import "syscall"

// sysProcAttr puts postgres in its own process group, runs it as cred (nil:
// the current user) and has the kernel ask it for a fast shutdown (SIGINT)
// when the thread that forked it, kept alive until postgres exits, dies with
// this process.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred, Pdeathsig: syscall.SIGINT}
}
