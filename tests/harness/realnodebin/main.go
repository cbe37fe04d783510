// Command realnodebin is the kubelet of the pinned Kubernetes version, built from its Go
// module for the tests' real node (tests/harness/realnode.py).
//
// It exists because this machine has no release binaries of the kubelet, and
// the kubelet cannot be built with `go install pkg@version` (the
// k8s.io/kubernetes module needs replace directives for its staging
// modules), so it needs a module of its own. It is a test harness only:
// edgeplug never ships it. containerd, its runc shim, ctr and the CNI plugins
// are built with `go install pkg@version` from their own modules (see
// tests/harness/realnodebin.py), so their dependency pins stay upstream's.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
