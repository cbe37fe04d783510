// The devicenode's pod side: admit pods bound to the node as the kubelet does, start their
// containers on paper, report them, release their devices when they end.
//
// It exists because a device is only given to a pod through kubelet admission: the topology
// manager's Admit (none policy) calls the device manager's Allocate for each init and app
// container in order (init containers' devices reused as the device manager reuses them), and a
// failure rejects the pod with the reason and message admission gives (UnexpectedAdmissionError).
// An admitted pod's containers are then "created": GetDeviceRunContainerOptions (which makes the
// PreStartContainer call), then CDI resolution as a CDI-enabled runtime does it. Pods are
// handled one at a time in watch order, as the kubelet's sync loop takes its pod updates
// (podEvents): a pod deleted before another was bound here releases its devices before that
// one is admitted.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// statusAttempts bounds the retries of one pod status write.
const statusAttempts = 5

type podAdmitter struct {
	client   kubernetes.Interface
	node     string
	manager  *devicemanager.ManagerImpl
	topology topologymanager.Manager
	records  *records
	cdiDirs  []string
	changed  func()

	mu       sync.Mutex
	live     map[string]*v1.Pod // uid -> pod, for pods that hold or are being given devices
	ready    bool               // sources ready: the initial pods were re-admitted
	informer cache.SharedIndexInformer
}

func newPodAdmitter(client kubernetes.Interface, node string, manager *devicemanager.ManagerImpl, topology topologymanager.Manager, records *records, cdiDirs []string, changed func()) *podAdmitter {
	return &podAdmitter{client: client, node: node, manager: manager, topology: topology, records: records,
		cdiDirs: cdiDirs, changed: changed, live: map[string]*v1.Pod{}}
}

// AddSource and AllReady make the admitter the device manager's config.SourcesReady: not ready
// until the pods found running at start were re-admitted, as the kubelet's sources are not
// ready before its first sync.
func (p *podAdmitter) AddSource(string) {}

func (p *podAdmitter) AllReady() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

func (p *podAdmitter) activePods() []*v1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make([]*v1.Pod, 0, len(p.live))
	for _, pod := range p.live {
		pods = append(pods, pod)
	}
	return pods
}

// GetActivePods, GetPods and GetPodByName serve the pod-resources API.
func (p *podAdmitter) GetActivePods() []*v1.Pod { return p.activePods() }
func (p *podAdmitter) GetPods() []*v1.Pod       { return p.activePods() }
func (p *podAdmitter) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range p.activePods() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

func (p *podAdmitter) run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(p.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", p.node).String()
		}))
	p.informer = factory.Core().V1().Pods().Informer()
	queue := newPodEvents()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.add(key)
		}
	}
	_, err := p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	})
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
		return ctx.Err()
	}
	p.readmit(ctx)
	go func() {
		<-ctx.Done()
		queue.shutDown()
	}()
	for {
		key, shutdown := queue.next()
		if shutdown {
			return nil
		}
		p.handle(ctx, key)
	}
}

// podEvents is a FIFO of pod keys, one entry per watch event, kept in the order the watch
// delivered them. client-go's workqueue would not do: it holds a key once, and a key added
// while it is being handled goes to the back, so a pod's deletion could be handled after
// the binding of a pod the scheduler placed on the devices that deletion freed, and that pod
// refused for devices the kubelet had already freed (a refusal the kubelet's ordered sync loop
// never makes). Each entry is handled against the pod's latest state in the informer's store,
// so a repeated key costs a no-op.
type podEvents struct {
	mu      sync.Mutex
	ready   *sync.Cond
	keys    []string
	stopped bool
}

func newPodEvents() *podEvents {
	q := &podEvents{}
	q.ready = sync.NewCond(&q.mu)
	return q
}

func (q *podEvents) add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.keys = append(q.keys, key)
	q.ready.Signal()
}

// next waits for the oldest key; shutdown is true once shutDown was called.
func (q *podEvents) next() (key string, shutdown bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.keys) == 0 && !q.stopped {
		q.ready.Wait()
	}
	if q.stopped {
		return "", true
	}
	key, q.keys = q.keys[0], q.keys[1:]
	return key, false
}

func (q *podEvents) shutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stopped = true
	q.ready.Broadcast()
}

// readmit runs admission again for the pods the runtime still runs, as a restarted kubelet
// does; the device manager keeps their devices from its checkpoint without calling Allocate.
func (p *podAdmitter) readmit(ctx context.Context) {
	var pods []*v1.Pod
	for _, uid := range p.records.live() {
		record := p.records.pod(uid)
		obj, exists, _ := p.informer.GetStore().GetByKey(record.Namespace + "/" + record.Name)
		pod, _ := obj.(*v1.Pod)
		if !exists || pod.UID != types.UID(uid) {
			p.records.update(uid, func(r *podRecord) { r.Live = false })
			continue
		}
		if !record.Admitted {
			p.records.remove(uid) // the kubelet stopped during its admission: admit it afresh
			continue
		}
		pods = append(pods, pod)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp) })
	p.mu.Lock()
	for _, pod := range pods {
		p.live[string(pod.UID)] = pod
	}
	p.mu.Unlock()
	for _, pod := range pods {
		if result := admit(ctx, p.topology, pod); !result.Admit {
			p.reject(ctx, pod, result.Reason, result.Message)
		}
	}
	p.mu.Lock()
	p.ready = true
	p.mu.Unlock()
	updateAllocatedDevices(p.manager)
	p.records.setReady()
}

func (p *podAdmitter) handle(ctx context.Context, key string) {
	obj, exists, err := p.informer.GetStore().GetByKey(key)
	if err != nil {
		return
	}
	if !exists {
		p.releaseByKey(key)
		return
	}
	pod := obj.(*v1.Pod)
	uid := string(pod.UID)
	if pod.DeletionTimestamp != nil {
		p.release(uid)
		// The containers "stop" at once; confirm the deletion as the kubelet does.
		zero := int64(0)
		_ = p.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		return
	}
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		p.release(uid)
		return
	}
	if record := p.records.pod(uid); record != nil {
		// Admitted, rejected or failed already. A failure whose status never reached the API
		// server (the node stopped first) is sent again, as a restarted kubelet does.
		if record.Phase == string(v1.PodFailed) {
			p.patchStatus(ctx, pod, map[string]any{
				"phase": v1.PodFailed, "reason": record.Reason, "message": record.Message})
		}
		return
	}
	p.admit(ctx, pod)
}

func (p *podAdmitter) admit(ctx context.Context, pod *v1.Pod) {
	uid := string(pod.UID)
	p.records.update(uid, func(r *podRecord) {
		r.Namespace, r.Name, r.Live, r.Phase = pod.Namespace, pod.Name, true, string(v1.PodPending)
	})
	p.mu.Lock()
	p.live[uid] = pod // the kubelet's pod manager holds a pod before admitting it
	p.mu.Unlock()
	result := admit(ctx, p.topology, pod)
	if !result.Admit {
		p.reject(ctx, pod, result.Reason, result.Message)
		return
	}
	var containers []containerRecord
	ordered := append([]v1.Container{}, pod.Spec.InitContainers...)
	ordered = append(ordered, pod.Spec.Containers...)
	for i := range ordered {
		c := &ordered[i]
		record, reason, err := p.createContainer(ctx, pod, c, i < len(pod.Spec.InitContainers))
		if err != nil {
			p.failContainer(ctx, pod, c.Name, reason, err)
			return
		}
		containers = append(containers, record)
	}
	p.records.update(uid, func(r *podRecord) {
		r.Admitted, r.Phase, r.Containers = true, string(v1.PodRunning), containers
	})
	p.patchStatus(ctx, pod, runningStatus(pod))
	p.changed()
}

// createContainer does what the kubelet does for a container with devices before the runtime
// creates it, and what a CDI-enabled runtime does with the CDI names it is handed.
//
// A failure says which step failed: the kubelet's own (CreateContainerConfigError, as when
// generating the container's config fails) or the runtime's (CreateContainerError).
func (p *podAdmitter) createContainer(ctx context.Context, pod *v1.Pod, c *v1.Container, init bool) (containerRecord, string, error) {
	record := containerRecord{Name: c.Name, Init: init, ContainerID: fmt.Sprintf("devicenode://%s/%s", pod.UID, c.Name),
		DeviceIDs: map[string][]string{}, Envs: map[string]string{}, Annotations: map[string]string{},
		Mounts: [][3]any{}, Devices: [][3]string{}, CDIDevices: []string{}}
	opts, err := p.manager.GetDeviceRunContainerOptions(ctx, pod, c)
	if err != nil {
		return record, "CreateContainerConfigError", err
	}
	for resource, devices := range p.manager.GetDevices(string(pod.UID), c.Name) {
		for id := range devices {
			record.DeviceIDs[resource] = append(record.DeviceIDs[resource], id)
		}
		sort.Strings(record.DeviceIDs[resource])
	}
	if opts == nil {
		return record, "", nil
	}
	for _, e := range opts.Envs {
		record.Envs[e.Name] = e.Value
	}
	for _, m := range opts.Mounts {
		record.Mounts = append(record.Mounts, [3]any{m.ContainerPath, m.HostPath, m.ReadOnly})
	}
	for _, d := range opts.Devices {
		record.Devices = append(record.Devices, [3]string{d.PathInContainer, d.PathOnHost, d.Permissions})
	}
	for _, a := range opts.Annotations {
		record.Annotations[a.Name] = a.Value
	}
	for _, d := range opts.CDIDevices {
		record.CDIDevices = append(record.CDIDevices, d.Name)
	}
	if len(record.CDIDevices) > 0 && len(p.cdiDirs) > 0 {
		edits, err := resolveCDI(p.cdiDirs, record.CDIDevices)
		if err != nil {
			return record, "CreateContainerError", err
		}
		record.CDI = edits
	}
	return record, "", nil
}

func (p *podAdmitter) reject(ctx context.Context, pod *v1.Pod, reason, message string) {
	fmt.Fprintf(os.Stderr, "devicenode %s: rejecting pod %s/%s: %s: %s\n", p.node, pod.Namespace, pod.Name, reason, message)
	p.end(string(pod.UID), string(v1.PodFailed), reason, message)
	p.patchStatus(ctx, pod, map[string]any{"phase": v1.PodFailed, "reason": reason, "message": "Pod was rejected: " + message})
}

// failContainer reports a container the runtime could not create. A kubelet would leave the pod
// Pending and retry; the harness fails it at once so that tests and controllers see it.
func (p *podAdmitter) failContainer(ctx context.Context, pod *v1.Pod, container, reason string, err error) {
	fmt.Fprintf(os.Stderr, "devicenode %s: pod %s/%s container %s: %v\n", p.node, pod.Namespace, pod.Name, container, err)
	p.end(string(pod.UID), string(v1.PodFailed), reason, err.Error())
	p.patchStatus(ctx, pod, map[string]any{
		"phase": v1.PodFailed, "reason": reason, "message": err.Error(),
		"containerStatuses": []map[string]any{{"name": container, "image": "", "imageID": "", "ready": false,
			"restartCount": 0, "state": map[string]any{"waiting": map[string]any{"reason": reason, "message": err.Error()}}}},
	})
}

func (p *podAdmitter) end(uid, phase, reason, message string) {
	p.records.update(uid, func(r *podRecord) { r.Live, r.Phase, r.Reason, r.Message = false, phase, reason, message })
	p.mu.Lock()
	delete(p.live, uid)
	p.mu.Unlock()
	updateAllocatedDevices(p.manager)
}

func (p *podAdmitter) release(uid string) {
	if record := p.records.pod(uid); record != nil && record.Live {
		p.end(uid, record.Phase, record.Reason, record.Message)
		p.changed()
	}
}

func (p *podAdmitter) releaseByKey(key string) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return
	}
	for _, uid := range p.records.live() {
		if record := p.records.pod(uid); record.Namespace == namespace && record.Name == name {
			p.release(uid)
		}
	}
}

func runningStatus(pod *v1.Pod) map[string]any {
	now := time.Now().UTC().Format(time.RFC3339)
	status := func(c v1.Container, state map[string]any, ready bool) map[string]any {
		return map[string]any{"name": c.Name, "image": c.Image, "imageID": "",
			"containerID": fmt.Sprintf("devicenode://%s/%s", pod.UID, c.Name), "ready": ready,
			"started": ready, "restartCount": 0, "state": state}
	}
	running := map[string]any{"running": map[string]any{"startedAt": now}}
	done := map[string]any{"terminated": map[string]any{"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}
	var conditions, containers, inits []map[string]any
	for _, kind := range []string{"PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"} {
		conditions = append(conditions, map[string]any{"type": kind, "status": "True", "lastTransitionTime": now})
	}
	for _, c := range pod.Spec.Containers {
		containers = append(containers, status(c, running, true))
	}
	for _, c := range pod.Spec.InitContainers {
		inits = append(inits, status(c, done, false))
	}
	return map[string]any{
		"phase": v1.PodRunning, "hostIP": "127.0.0.1", "hostIPs": []map[string]string{{"ip": "127.0.0.1"}},
		"podIP": "127.0.0.1", "podIPs": []map[string]string{{"ip": "127.0.0.1"}}, "startTime": now,
		"conditions": conditions, "containerStatuses": containers, "initContainerStatuses": inits,
	}
}

func (p *podAdmitter) patchStatus(ctx context.Context, pod *v1.Pod, status map[string]any) {
	patch, _ := json.Marshal(map[string]any{"status": status})
	for attempt := 1; attempt <= statusAttempts; attempt++ {
		_, err := p.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: fieldManager}, "status")
		if err == nil || apierrors.IsNotFound(err) || ctx.Err() != nil {
			return
		}
		fmt.Fprintf(os.Stderr, "devicenode %s: status of %s/%s: %v\n", p.node, pod.Namespace, pod.Name, err)
		time.Sleep(time.Duration(attempt) * 200 * time.Millisecond)
	}
}
