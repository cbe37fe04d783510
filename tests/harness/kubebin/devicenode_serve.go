// The devicenode's other faces: the kubelet's pod-resources API, CDI resolution as a runtime
// does it, and the commands the harness sends on stdin.
//
// It exists because agents read the pod-resources API (served here by the kubelet's own
// server over the device manager, as the kubelet serves it), containers with CDI devices are
// only created once a runtime resolves those names (done here with the CDI project's own
// module, as containerd and CRI-O do), and a test must be able to make a node NotReady.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	podresourcesv1alpha1 "k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// devicesProvider adapts the device manager to the pod-resources server, as the kubelet's
// container manager does.
type devicesProvider struct{ manager *devicemanager.ManagerImpl }

func containerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesv1.ContainerDevices {
	var out []*podresourcesv1.ContainerDevices
	for resource, devices := range devs {
		for id, dev := range devices {
			entry := &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}}
			if topo := dev.GetTopology(); topo != nil {
				for _, node := range topo.GetNodes() {
					out = append(out, &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: []string{id},
						Topology: &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: node.GetID()}}}})
				}
				continue
			}
			out = append(out, entry)
		}
	}
	return out
}

func (d devicesProvider) GetDevices(podUID, container string) []*podresourcesv1.ContainerDevices {
	return containerDevices(d.manager.GetDevices(podUID, container))
}

// noCPUsOrMemory is a node without CPU or memory managers (their none policies report nothing).
type noCPUsOrMemory struct{}

// servePodResources serves the kubelet's pod-resources server (v1 and v1alpha1, rate-limited
// as the kubelet's) on socketPath; the returned func stops it.
func servePodResources(ctx context.Context, socketPath string, pods *podAdmitter, manager *devicemanager.ManagerImpl) (func(), error) {
	providers := podresources.PodResourcesProviders{
		Pods: pods, Devices: devicesProvider{manager}, Cpus: noCPUsOrMemory{}, Memory: noCPUsOrMemory{},
		DynamicResources: noCPUsOrMemory{},
	}
	server := grpc.NewServer(apisgrpc.WithRateLimiter(ctx, "podresources", podresources.DefaultQPS, podresources.DefaultBurstTokens))
	podresourcesv1alpha1.RegisterPodResourcesListerServer(server, podresources.NewV1alpha1PodResourcesServer(providers))
	podresourcesv1.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, providers))
	if err := os.MkdirAll(filepath.Dir(socketPath), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	listener, err := net.Listen("unix", socketPath)
	if err != nil {
		return nil, err
	}
	go func() { _ = server.Serve(listener) }()
	return func() { server.Stop(); _ = os.Remove(socketPath) }, nil
}

// resolveCDI injects the named CDI devices into an empty OCI spec from the specs in dirs, as a
// CDI-enabled runtime does at container creation; an unresolvable name fails the creation.
func resolveCDI(dirs []string, names []string) (*cdiEdits, error) {
	registry, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if registry == nil {
		return nil, fmt.Errorf("CDI registry: %w", err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := registry.InjectDevices(spec, names...); err != nil {
		return nil, fmt.Errorf("CDI device injection failed (unresolved %v): %w", unresolved, err)
	}
	edits := &cdiEdits{Env: spec.Process.Env, DeviceNodes: []cdiNode{}, Mounts: []cdiMount{}}
	for _, d := range spec.Linux.Devices {
		edits.DeviceNodes = append(edits.DeviceNodes, cdiNode{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor})
	}
	if spec.Linux.Resources != nil {
		for i, rule := range spec.Linux.Resources.Devices {
			if i < len(edits.DeviceNodes) && rule.Allow {
				edits.DeviceNodes[i].Permissions = rule.Access
			}
		}
	}
	for _, m := range spec.Mounts {
		edits.Mounts = append(edits.Mounts, cdiMount{Source: m.Source, Destination: m.Destination, Options: m.Options})
	}
	return edits, nil
}

// readCommands serves the harness's commands, one a line: "ready true" or "ready false".
// Each is answered on stdout with "ok <command>" or "error <command>: <why>". The end of stdin
// (the harness went away) stops the node.
func readCommands(ctx context.Context, in io.Reader, node *nodeReporter, stop func()) {
	defer stop()
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		command := strings.TrimSpace(lines.Text())
		var err error
		switch command {
		case "ready true", "ready false":
			err = node.setReady(ctx, command == "ready true")
		case "":
			continue
		default:
			err = fmt.Errorf("unknown command")
		}
		if err != nil {
			fmt.Printf("error %s: %v\n", command, err)
		} else {
			fmt.Printf("ok %s\n", command)
		}
	}
}
