// The devicenode's Node object: registration, Lease heartbeat, capacity from the device manager.
//
// It exists because the scheduler places pods only on a Ready, untainted Node whose
// status.allocatable holds the requested resources, and the node-lifecycle controller taints a
// Node whose Lease goes stale. Capacity and allocatable of device resources come from the device
// manager's GetCapacity, as the kubelet's node status setter takes them; resources GetCapacity
// reports deleted (a plugin gone past its grace) drop to 0, as the kubelet sets them.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	v1helper "k8s.io/kubernetes/pkg/apis/core/v1/helper"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/utils/ptr"
)

const (
	// heartbeatInterval renews the Lease and Ready condition well inside the controller's
	// 40 s grace, even on a busy machine.
	heartbeatInterval = 5 * time.Second
	statusRetry       = 500 * time.Millisecond
	leaseNamespace    = "kube-node-lease"
	leaseDurationS    = 40
	fieldManager      = "edgeplug-devicenode"
	kubeletVersion    = "v1.36.3"
)

// baseResources is what every node offers besides devices: enough for many small test pods.
var baseResources = map[v1.ResourceName]string{
	v1.ResourceCPU: "16", v1.ResourceMemory: "64Gi", v1.ResourcePods: "250",
	v1.ResourceEphemeralStorage: "100Gi",
}

// readinessTaints say a node is not (yet) ready; removed once Ready is posted, as the
// node-lifecycle controller would some seconds later.
var readinessTaints = map[string]bool{"node.kubernetes.io/not-ready": true, "node.kubernetes.io/unreachable": true}

type nodeReporter struct {
	client  kubernetes.Interface
	name    string
	labels  map[string]string
	manager *devicemanager.ManagerImpl
	changed chan struct{}

	mu         sync.Mutex
	ready      bool
	readySince metav1.Time
	bootTime   metav1.Time
	// resetExtended: zero the Node's extended resources at the first status write, as the
	// kubelet does when its device-manager checkpoint is gone (a new or rebooted node).
	resetExtended bool
}

func newNodeReporter(client kubernetes.Interface, name string, extra map[string]string, manager *devicemanager.ManagerImpl) *nodeReporter {
	labels := map[string]string{
		"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		"edgeplug.io/emulated-node": "true",
	}
	for k, v := range extra {
		labels[k] = v
	}
	now := metav1.Now()
	return &nodeReporter{client: client, name: name, labels: labels, manager: manager,
		changed: make(chan struct{}, 1), ready: true, readySince: now, bootTime: now,
		resetExtended: manager.ShouldResetExtendedResourceCapacity()}
}

func zeroExtended(resources v1.ResourceList) v1.ResourceList {
	out := v1.ResourceList{}
	for name, q := range resources {
		if v1helper.IsExtendedResourceName(name) {
			q = *resource.NewQuantity(0, resource.DecimalSI)
		}
		out[name] = q
	}
	return out
}

// poke asks for the status to be written soon (device counts changed).
func (n *nodeReporter) poke() {
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

func (n *nodeReporter) start(ctx context.Context) error {
	if err := n.ensureNode(ctx); err != nil {
		return err
	}
	if err := n.writeStatus(ctx); err != nil {
		return err
	}
	if err := n.renewLease(ctx); err != nil {
		return err
	}
	if err := n.clearReadinessTaints(ctx); err != nil {
		return err
	}
	go n.heartbeat(ctx)
	return nil
}

func (n *nodeReporter) setReady(ctx context.Context, ready bool) error {
	n.mu.Lock()
	if ready != n.ready {
		n.ready, n.readySince = ready, metav1.Now()
	}
	n.mu.Unlock()
	if err := n.writeStatus(ctx); err != nil {
		return err
	}
	if ready {
		return n.clearReadinessTaints(ctx)
	}
	return nil
}

func (n *nodeReporter) heartbeat(ctx context.Context) {
	nextLease := time.Now().Add(heartbeatInterval)
	for {
		timer := time.NewTimer(time.Until(nextLease))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-n.changed:
		case <-timer.C:
		}
		timer.Stop()
		err := n.writeStatus(ctx)
		if err == nil && !time.Now().Before(nextLease) {
			err = n.renewLease(ctx)
			nextLease = time.Now().Add(heartbeatInterval)
		}
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "devicenode %s: status: %v\n", n.name, err)
			if apierrors.IsNotFound(err) {
				_ = n.ensureNode(ctx)
			}
			n.poke()
			select {
			case <-ctx.Done():
				return
			case <-time.After(statusRetry):
			}
		}
	}
}

func (n *nodeReporter) ensureNode(ctx context.Context) error {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: n.labels}}
	_, err := n.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{FieldManager: fieldManager})
	if err == nil || !apierrors.IsAlreadyExists(err) {
		return err
	}
	// Adopt the existing Node, as a restarted kubelet does: our labels, schedulable.
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"labels": n.labels},
		"spec":     map[string]any{"unschedulable": false},
	})
	_, err = n.client.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	return err
}

func (n *nodeReporter) clearReadinessTaints(ctx context.Context) error {
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	kept := []v1.Taint{}
	for _, t := range node.Spec.Taints {
		if !readinessTaints[t.Key] {
			kept = append(kept, t)
		}
	}
	if len(kept) == len(node.Spec.Taints) {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec":     map[string]any{"taints": kept},
	})
	_, err = n.client.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if apierrors.IsConflict(err) {
		return nil // the node-lifecycle controller changed them meanwhile; it clears them itself
	}
	return err
}

// status computes the Node's status as the kubelet's MachineInfo setter does: the capacity the
// Node already has is kept (an extended resource keeps its last value), device-plugin capacity
// overwrites it, resources the device manager removed drop to 0, and allocatable is capacity
// (nothing reserved here) overwritten by device-plugin allocatable.
func (n *nodeReporter) status(existing v1.ResourceList) v1.NodeStatus {
	capacity, allocatable := v1.ResourceList{}, v1.ResourceList{}
	for name, q := range existing {
		capacity[name] = q
	}
	for name, q := range baseResources {
		capacity[name] = resource.MustParse(q)
	}
	devCapacity, devAllocatable, removed := deviceCapacity(n.manager)
	for name, q := range devCapacity {
		capacity[name] = q
	}
	for _, name := range removed {
		capacity[v1.ResourceName(name)] = *resource.NewQuantity(0, resource.DecimalSI)
	}
	for name, q := range capacity {
		allocatable[name] = q
	}
	for name, q := range devAllocatable {
		allocatable[name] = q
	}
	n.mu.Lock()
	ready, since, boot := n.ready, n.readySince, n.bootTime
	n.mu.Unlock()
	now := metav1.Now()
	condition := func(kind v1.NodeConditionType, status v1.ConditionStatus, reason, message string, since metav1.Time) v1.NodeCondition {
		return v1.NodeCondition{Type: kind, Status: status, Reason: reason, Message: message, LastHeartbeatTime: now, LastTransitionTime: since}
	}
	readyCondition := condition(v1.NodeReady, v1.ConditionTrue, "KubeletReady", "kubelet is posting ready status", since)
	if !ready {
		readyCondition = condition(v1.NodeReady, v1.ConditionFalse, "KubeletNotReady", "devicenode was told it is not ready", since)
	}
	return v1.NodeStatus{
		Capacity: capacity, Allocatable: allocatable,
		Conditions: []v1.NodeCondition{
			readyCondition,
			condition(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory", "devicenode", boot),
			condition(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure", "devicenode", boot),
			condition(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID", "devicenode", boot),
		},
		Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: n.name}},
		NodeInfo: v1.NodeSystemInfo{
			MachineID: n.name, SystemUUID: n.name, BootID: boot.UTC().Format(time.RFC3339),
			KernelVersion: "devicenode", OSImage: "edgeplug devicenode", ContainerRuntimeVersion: "devicenode://1",
			KubeletVersion: kubeletVersion, OperatingSystem: "linux", Architecture: "amd64",
		},
	}
}

// writeStatus replaces the Node's status with the one status() computes from it.
func (n *nodeReporter) writeStatus(ctx context.Context) error {
	node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	n.mu.Lock()
	reset := n.resetExtended
	n.resetExtended = false
	n.mu.Unlock()
	existing := node.Status.Capacity
	if reset {
		existing = zeroExtended(existing)
	}
	node.Status = n.status(existing)
	_, err = n.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{FieldManager: fieldManager})
	if apierrors.IsConflict(err) {
		n.poke()
		return nil
	}
	return err
}

func (n *nodeReporter) renewLease(ctx context.Context) error {
	leases := n.client.CoordinationV1().Leases(leaseNamespace)
	now := metav1.NowMicro()
	lease, err := leases.Get(ctx, n.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.name, Namespace: leaseNamespace, OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "v1", Kind: "Node", Name: n.name, UID: node.UID}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.name), LeaseDurationSeconds: ptr.To[int32](leaseDurationS), RenewTime: &now},
		}
		_, err = leases.Create(ctx, lease, metav1.CreateOptions{FieldManager: fieldManager})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime, lease.Spec.HolderIdentity = &now, ptr.To(n.name)
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{FieldManager: fieldManager})
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}
