// What a devicenode did, kept in one JSON file the Python harness reads.
//
// It exists because tests assert on what the kubelet did (registrations it accepted, healthy
// devices, what each container got) and the harness reads it from this file, rewritten whole
// (write then rename) on every change. The file is also the emulated container runtime's state:
// the containers it "runs" outlive a kubelet restart, as a real runtime's do, so a restarted
// devicenode reads them back and hands them to the device manager as running containers.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
)

type registration struct {
	Resource                        string    `json:"resource"`
	Endpoint                        string    `json:"endpoint"`
	Time                            time.Time `json:"time"`
	PreStartRequired                bool      `json:"preStartRequired"`
	GetPreferredAllocationAvailable bool      `json:"getPreferredAllocationAvailable"`
}

// cdiEdits is what a CDI-enabled runtime added to the container for its CDI devices.
type cdiEdits struct {
	Env         []string   `json:"env"`
	DeviceNodes []cdiNode  `json:"deviceNodes"`
	Mounts      []cdiMount `json:"mounts"`
}

type cdiNode struct {
	Path        string `json:"path"`
	Type        string `json:"type"`
	Major       int64  `json:"major"`
	Minor       int64  `json:"minor"`
	Permissions string `json:"permissions"`
}

type cdiMount struct {
	Source      string   `json:"source"`
	Destination string   `json:"destination"`
	Options     []string `json:"options"`
}

// containerRecord is one container as the runtime was asked to create it.
type containerRecord struct {
	Name        string              `json:"name"`
	Init        bool                `json:"init"`
	ContainerID string              `json:"containerID"`
	DeviceIDs   map[string][]string `json:"deviceIDs"` // resource -> device ids (GetDevices)
	Envs        map[string]string   `json:"envs"`
	Mounts      [][3]any            `json:"mounts"`  // container path, host path, read-only
	Devices     [][3]string         `json:"devices"` // container path, host path, permissions
	CDIDevices  []string            `json:"cdiDevices"`
	Annotations map[string]string   `json:"annotations"`
	CDI         *cdiEdits           `json:"cdi"`
}

type podRecord struct {
	Namespace  string            `json:"namespace"`
	Name       string            `json:"name"`
	UID        string            `json:"uid"`
	Live       bool              `json:"live"`     // admitted (or being admitted), not ended
	Admitted   bool              `json:"admitted"` // its containers were created
	Phase      string            `json:"phase"`
	Reason     string            `json:"reason"`
	Message    string            `json:"message"`
	Containers []containerRecord `json:"containers"`
}

type recordData struct {
	Registrations []registration      `json:"registrations"`
	Healthy       map[string][]string `json:"healthy"`
	Connected     map[string]bool     `json:"connected"` // resource -> a plugin client is connected
	Pods          []*podRecord        `json:"pods"`
	Started       time.Time           `json:"started"`
	Ready         bool                `json:"ready"` // the node's first status is posted
}

type records struct {
	mu     sync.Mutex
	saveMu sync.Mutex // one writer of the file at a time
	path   string
	data   recordData
}

func loadRecords(path string) (*records, error) {
	r := &records{path: path}
	raw, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(raw, &r.data); err != nil {
			return nil, fmt.Errorf("records %s: %w", path, err)
		}
	}
	r.data.Healthy = map[string][]string{} // a fresh kubelet knows no devices yet
	r.data.Connected = map[string]bool{}
	r.data.Started = time.Now().UTC()
	r.data.Ready = false
	return r, nil
}

// runtimeContainers is what the container runtime reports running: containers of live,
// admitted pods (init containers ran to completion and are not running).
func (r *records) runtimeContainers() (containermap.ContainerMap, sets.Set[string]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	containers, running := containermap.NewContainerMap(), sets.New[string]()
	for _, pod := range r.data.Pods {
		if !pod.Live || !pod.Admitted {
			continue
		}
		for _, c := range pod.Containers {
			containers.Add(pod.UID, c.Name, c.ContainerID)
			if !c.Init {
				running.Insert(c.ContainerID)
			}
		}
	}
	return containers, running
}

func (r *records) addRegistration(reg registration) {
	r.mu.Lock()
	r.data.Registrations = append(r.data.Registrations, reg)
	r.mu.Unlock()
	r.save()
}

func (r *records) setHealthy(healthy map[string][]string) {
	for _, ids := range healthy {
		sort.Strings(ids)
	}
	r.mu.Lock()
	r.data.Healthy = healthy
	r.mu.Unlock()
	r.save()
}

func (r *records) setConnected(resource string, connected bool) {
	r.mu.Lock()
	r.data.Connected[resource] = connected
	r.mu.Unlock()
	r.save()
}

func (r *records) setReady() {
	r.mu.Lock()
	r.data.Ready = true
	r.mu.Unlock()
	r.save()
}

// pod returns the record of the pod with this uid, or nil.
func (r *records) pod(uid string) *podRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.data.Pods {
		if p.UID == uid {
			return p
		}
	}
	return nil
}

// update changes a pod's record (adding it when new) under the lock, then saves.
func (r *records) update(uid string, change func(*podRecord)) {
	r.mu.Lock()
	var found *podRecord
	for _, p := range r.data.Pods {
		if p.UID == uid {
			found = p
		}
	}
	if found == nil {
		found = &podRecord{UID: uid}
		r.data.Pods = append(r.data.Pods, found)
	}
	change(found)
	r.mu.Unlock()
	r.save()
}

// remove forgets a pod.
func (r *records) remove(uid string) {
	r.mu.Lock()
	kept := r.data.Pods[:0]
	for _, p := range r.data.Pods {
		if p.UID != uid {
			kept = append(kept, p)
		}
	}
	r.data.Pods = kept
	r.mu.Unlock()
	r.save()
}

// live lists the uids of pods that hold (or are being given) devices.
func (r *records) live() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var uids []string
	for _, p := range r.data.Pods {
		if p.Live {
			uids = append(uids, p.UID)
		}
	}
	return uids
}

func (r *records) save() {
	r.saveMu.Lock()
	defer r.saveMu.Unlock()
	r.mu.Lock()
	raw, err := json.Marshal(&r.data)
	r.mu.Unlock()
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicenode: encoding records:", err)
		return
	}
	partial := r.path + ".partial"
	if err := os.WriteFile(partial, raw, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "devicenode: writing records:", err)
		return
	}
	if err := os.Rename(partial, r.path); err != nil {
		fmt.Fprintln(os.Stderr, "devicenode: writing records:", err)
	}
}
