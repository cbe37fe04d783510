// Command kubebin is one binary that serves as etcd, kube-apiserver,
// kube-scheduler, kube-controller-manager and kubectl, chosen by its first
// argument; and, for the tests, as a node whose device side is the kubelet's own
// device manager (devicenode) and as a grpc-go device plugin (testplugin).
//
// It exists because linking the three Kubernetes control-plane commands and
// etcd separately costs three to four times the link time and disk on a
// 2-core machine, the way Kubernetes' retired hyperkube did. It is a test
// and demo harness only: edgeplug never ships it.
package main

import (
	"fmt"
	"os"

	_ "time/tzdata" // CronJob time zones in the controller-manager

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var commands = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubectl":                 kubectl.NewDefaultKubectlCommand,
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubebin etcd|kube-apiserver|kube-scheduler|kube-controller-manager|kubectl|devicenode|testplugin [args]")
		os.Exit(2)
	}
	name := os.Args[1]
	switch name {
	case "devicenode":
		os.Exit(runDeviceNode(os.Args[2:]))
	case "testplugin":
		os.Exit(runTestPlugin(os.Args[2:]))
	}
	if name == "etcd" {
		// etcdmain reads its flags from the slice it is given, program name first.
		etcdmain.Main(append([]string{"etcd"}, os.Args[2:]...))
		return
	}
	newCommand, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kubebin: unknown command %q\n", name)
		os.Exit(2)
	}
	// Each command reads os.Args itself (kubectl looks for plugins there), so
	// make it look as if the command had been run under its own name.
	os.Args = append([]string{name}, os.Args[2:]...)
	os.Exit(cli.Run(newCommand()))
}
