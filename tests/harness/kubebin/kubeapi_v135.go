//go:build kube135

// The kubelet internals devicenode calls, as Kubernetes v1.35 declares them (no logger on the
// device and topology managers' reads, no context on admission). The newest version's are in
// kubeapi_newest.go; the harness builds this file with -tags kube135.
package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

func newTopologyManager(klog.Logger) (topologymanager.Manager, error) {
	// "container": the scope name v1.35 keeps unexported (v1.37: topologymanager.ContainerTopologyScope).
	return topologymanager.NewManager(nil, topologymanager.PolicyNone, "container", nil)
}

func newDeviceManager(_ klog.Logger, topology topologymanager.Manager) (*devicemanager.ManagerImpl, error) {
	return devicemanager.NewManagerImpl(nil, topology)
}

func deviceCapacity(m *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList, []string) {
	return m.GetCapacity()
}

func allocatableDevices(m *devicemanager.ManagerImpl) devicemanager.ResourceDeviceInstances {
	return m.GetAllocatableDevices()
}

func updateAllocatedDevices(m *devicemanager.ManagerImpl) { m.UpdateAllocatedDevices() }

func admit(_ context.Context, topology topologymanager.Manager, pod *v1.Pod) lifecycle.PodAdmitResult {
	return topology.Admit(&lifecycle.PodAdmitAttributes{Pod: pod})
}

func (w *pluginWatcher) PluginDisconnected(logger klog.Logger, resource string) {
	w.manager.PluginDisconnected(logger, resource)
	w.disconnected(resource)
}

func (d devicesProvider) UpdateAllocatedDevices() { d.manager.UpdateAllocatedDevices() }
func (d devicesProvider) GetAllocatableDevices() []*podresourcesv1.ContainerDevices {
	return containerDevices(d.manager.GetAllocatableDevices())
}

func (noCPUsOrMemory) GetCPUs(string, string) []int64                             { return nil }
func (noCPUsOrMemory) GetAllocatableCPUs() []int64                                { return nil }
func (noCPUsOrMemory) GetMemory(string, string) []*podresourcesv1.ContainerMemory { return nil }
func (noCPUsOrMemory) GetAllocatableMemory() []*podresourcesv1.ContainerMemory    { return nil }
func (noCPUsOrMemory) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesv1.DynamicResource {
	return nil
}
