// devicenode: one Kubernetes node whose device side is the kubelet's own code.
//
// It exists because every claim edgeplug makes about device-plugin slots, re-registration and
// Allocate must hold against the real kubelet, and no kubelet can run here without a container
// runtime. The kubelet's device manager (pkg/kubelet/cm/devicemanager) and its pod-resources
// server (pkg/kubelet/apis/podresources) need none: this command runs them for one node,
// registers the Node, reports capacity and allocatable from GetCapacity, admits the pods bound
// to the node through the topology manager's admission (none policy) as the kubelet does,
// starts their containers only on paper (GetDeviceRunContainerOptions, then CDI resolution as a
// CDI-enabled runtime does it), and records the outcome in a JSON file the Python harness reads.
//
// The device manager's socket directory is fixed at /var/lib/kubelet/device-plugins/, so each
// node runs in its own mount namespace (started under `unshare -m`): it bind-mounts its state
// directory over /var/lib/kubelet and the given plugin directory over device-plugins/ there.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	// kubeletRoot is where the kubelet keeps its state; the device manager's paths hang off it.
	kubeletRoot  = "/var/lib/kubelet"
	kubeAPIQPS   = 50
	kubeAPIBurst = 100
)

type nodeFlags struct {
	kubeconfig   string
	nodeName     string
	stateDir     string
	pluginDir    string
	podResources string
	records      string
	cdiDirs      string
	labels       string
}

func parseNodeFlags(args []string) (nodeFlags, error) {
	var f nodeFlags
	fs := flag.NewFlagSet("devicenode", flag.ContinueOnError)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	fs.StringVar(&f.nodeName, "node-name", "", "name of the Node")
	fs.StringVar(&f.stateDir, "state-dir", "", "host directory mounted over /var/lib/kubelet")
	fs.StringVar(&f.pluginDir, "plugin-dir", "", "host directory mounted over device-plugins/ (default: <state-dir>/device-plugins)")
	fs.StringVar(&f.podResources, "pod-resources-socket", "", "where to serve the pod-resources API (empty: not served)")
	fs.StringVar(&f.records, "records", "", "JSON file recording registrations, devices and containers (also the runtime's state)")
	fs.StringVar(&f.cdiDirs, "cdi-spec-dirs", "", "comma-separated CDI spec directories, as a runtime is configured (empty: a runtime with CDI disabled, which ignores CDI names)")
	fs.StringVar(&f.labels, "labels", "", "comma-separated key=value labels for the Node")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	for name, value := range map[string]string{"kubeconfig": f.kubeconfig, "node-name": f.nodeName, "state-dir": f.stateDir, "records": f.records} {
		if value == "" {
			return f, fmt.Errorf("--%s is required", name)
		}
	}
	if f.pluginDir == "" {
		f.pluginDir = filepath.Join(f.stateDir, "device-plugins")
	}
	return f, nil
}

func parseLabels(spec string) (map[string]string, error) {
	labels := map[string]string{}
	for _, item := range strings.Split(spec, ",") {
		if item == "" {
			continue
		}
		key, value, ok := strings.Cut(item, "=")
		if !ok || key == "" {
			return nil, fmt.Errorf("label %q is not key=value", item)
		}
		labels[key] = value
	}
	return labels, nil
}

// ownMountNamespace refuses to bind-mount anything unless this process has a mount namespace
// of its own: run without `unshare -m`, it would cover the host's /var/lib/kubelet.
func ownMountNamespace() error {
	mine, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err == nil && parent == mine {
		return errors.New("devicenode must run in a mount namespace of its own (start it under `unshare -m`)")
	}
	return nil
}

func bindMounts(stateDir, pluginDir string) error {
	if err := ownMountNamespace(); err != nil {
		return err
	}
	// Nothing mounted here may leak back to the host.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	for _, dir := range []string{stateDir, pluginDir, kubeletRoot} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	if err := syscall.Mount(stateDir, kubeletRoot, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s over %s: %w", stateDir, kubeletRoot, err)
	}
	target := filepath.Clean(pluginapi.DevicePluginPath)
	if err := os.MkdirAll(target, 0o750); err != nil {
		return err
	}
	if filepath.Clean(pluginDir) != filepath.Join(stateDir, "device-plugins") {
		if err := syscall.Mount(pluginDir, target, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s over %s: %w", pluginDir, target, err)
		}
	}
	return nil
}

func runDeviceNode(args []string) int {
	flags, err := parseNodeFlags(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicenode:", err)
		return 2
	}
	labels, err := parseLabels(flags.labels)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicenode:", err)
		return 2
	}
	if err := bindMounts(flags.stateDir, flags.pluginDir); err != nil {
		fmt.Fprintln(os.Stderr, "devicenode:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.FromContext(ctx)

	config, err := clientcmd.BuildConfigFromFlags("", flags.kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicenode: kubeconfig:", err)
		return 1
	}
	// The kubelet's defaults (KubeletConfiguration kubeAPIQPS 50, kubeAPIBurst 100), not
	// client-go's 5/10, which would throttle status writes to one per 200 ms.
	config.QPS, config.Burst = kubeAPIQPS, kubeAPIBurst
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicenode: client:", err)
		return 1
	}

	records, err := loadRecords(flags.records)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicenode:", err)
		return 1
	}
	// The simplest real topology manager: the none policy, as a kubelet without
	// --topology-manager-policy runs.
	topology, err := newTopologyManager(logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicenode: topology manager:", err)
		return 1
	}
	manager, err := newDeviceManager(logger, topology)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicenode: device manager:", err)
		return 1
	}
	topology.AddHintProvider(logger, manager)

	node := newNodeReporter(client, flags.nodeName, labels, manager)
	pods := newPodAdmitter(client, flags.nodeName, manager, topology, records, splitDirs(flags.cdiDirs), node.poke)
	watcher := newPluginWatcher(manager, records, node.poke)
	if err := watcher.install(logger); err != nil {
		fmt.Fprintln(os.Stderr, "devicenode:", err)
		return 1
	}
	// What the container runtime reports running survives a kubelet restart (the records
	// file); the device manager uses it to keep those containers' devices without Allocate.
	containers, running := records.runtimeContainers()
	if err := manager.Start(logger, pods.activePods, pods, containers, running); err != nil {
		fmt.Fprintln(os.Stderr, "devicenode: starting the device manager:", err)
		return 1
	}
	defer func() { _ = manager.Stop(logger) }()
	if flags.podResources != "" {
		stopPodResources, err := servePodResources(ctx, flags.podResources, pods, manager)
		if err != nil {
			fmt.Fprintln(os.Stderr, "devicenode: pod-resources:", err)
			return 1
		}
		defer stopPodResources()
	}
	if err := node.start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "devicenode: node:", err)
		return 1
	}
	go readCommands(ctx, os.Stdin, node, stop)
	if err := pods.run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "devicenode: pods:", err)
		return 1
	}
	records.save()
	fmt.Fprintf(os.Stderr, "devicenode %s stopped at %s\n", flags.nodeName, time.Now().Format(time.RFC3339))
	return 0
}

func splitDirs(spec string) []string {
	var dirs []string
	for _, d := range strings.Split(spec, ",") {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}
