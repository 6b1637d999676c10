package chaos

import (
	"os/exec"
	"syscall"
)

// setParentDeath makes the kernel SIGKILL the consumer if the harness dies
// first, so that no consumer outlives an interrupted run.
func setParentDeath(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
