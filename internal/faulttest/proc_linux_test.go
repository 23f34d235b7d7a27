package faulttest

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel SIGKILL the child when the test process
// dies (a test binary killed by its timeout runs no cleanup).
func dieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
