//go:build !linux

package chaos

import "os/exec"

// setParentDeath: only Linux can tie the consumer's life to the harness's;
// elsewhere an interrupted run may leave consumers to stop by hand.
func setParentDeath(*exec.Cmd) {}
