//go:build !linux

package faulttest

import "os/exec"

// dieWithParent does nothing here: only Linux has a parent-death signal.
// The relay helper process ends itself after helperLifetime.
func dieWithParent(*exec.Cmd) {}
