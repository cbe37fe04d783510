// Command pause is the sandbox ("pause") container's process for the tests'
// real node: it holds the pod's namespaces open and does nothing else.
//
// It exists because the node imports its images from local archives (no
// registry at test time), so the pause image is built here: a static binary
// that waits for SIGINT or SIGTERM and exits, reaping any child it inherits
// as the pod's PID 1 would, like Kubernetes' own pause.c.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
