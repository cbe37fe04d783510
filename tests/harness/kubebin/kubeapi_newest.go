//go:build !kube135

// The kubelet internals devicenode calls, as Kubernetes v1.37 declares them (contextual
// logging: the device and topology managers take a logger, admission a context, a plugin's
// disconnection names its socket). kubeapi_v135.go declares the same functions for v1.35;
// the harness builds that one with -tags kube135 (tests/harness/kubebin.py).
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

func newTopologyManager(logger klog.Logger) (topologymanager.Manager, error) {
	return topologymanager.NewManager(logger, nil, topologymanager.PolicyNone, topologymanager.ContainerTopologyScope, nil)
}

func newDeviceManager(logger klog.Logger, topology topologymanager.Manager) (*devicemanager.ManagerImpl, error) {
	return devicemanager.NewManagerImpl(logger, nil, topology)
}

func deviceCapacity(m *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList, []string) {
	return m.GetCapacity(klog.Background())
}

func allocatableDevices(m *devicemanager.ManagerImpl) devicemanager.ResourceDeviceInstances {
	return m.GetAllocatableDevices(klog.Background())
}

func updateAllocatedDevices(m *devicemanager.ManagerImpl) {
	m.UpdateAllocatedDevices(klog.Background())
}

// admit admits a pod being added, as the kubelet's pod workers do (the device manager allocates
// only for the add operation; a resize is not a new allocation).
func admit(ctx context.Context, topology topologymanager.Manager, pod *v1.Pod) lifecycle.PodAdmitResult {
	return topology.Admit(ctx, &lifecycle.PodAdmitAttributes{Pod: pod, Operation: lifecycle.AddOperation})
}

func (w *pluginWatcher) PluginDisconnected(logger klog.Logger, resource string, socket string) {
	w.manager.PluginDisconnected(logger, resource, socket)
	w.disconnected(resource)
}

func (d devicesProvider) UpdateAllocatedDevices(logger klog.Logger) {
	d.manager.UpdateAllocatedDevices(logger)
}
func (d devicesProvider) GetAllocatableDevices(logger klog.Logger) []*podresourcesv1.ContainerDevices {
	return containerDevices(d.manager.GetAllocatableDevices(logger))
}

func (noCPUsOrMemory) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (noCPUsOrMemory) GetPodCPUs(string) []int64              { return nil }
func (noCPUsOrMemory) GetAllocatableCPUs() []int64            { return nil }
func (noCPUsOrMemory) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesv1.ContainerMemory {
	return nil
}
func (noCPUsOrMemory) GetPodMemory(klog.Logger, string) []*podresourcesv1.ContainerMemory {
	return nil
}
func (noCPUsOrMemory) GetAllocatableMemory(klog.Logger) []*podresourcesv1.ContainerMemory {
	return nil
}
func (noCPUsOrMemory) GetDynamicResources(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesv1.DynamicResource {
	return nil
}
