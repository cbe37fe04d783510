// The device manager's own registration server, with the node told of what it does.
//
// It exists because the tests must see each registration the kubelet accepted (which resource,
// which endpoint, which options) and the node must post capacity as soon as a plugin's device
// list changes, yet the device manager keeps both to itself. NewManagerImpl builds its
// registration server (plugin/v1beta1.NewServer) with the manager as the handler of plugin
// clients; we build the same server with the same manager behind a handler that passes every
// call through unchanged and then takes note. Registration, dialling (authority "localhost",
// 10 s blocking dial), ListAndWatch and the checkpoint stay the kubelet's code.
package main

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"sync"
	"time"
	"unsafe"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

type pluginWatcher struct {
	manager *devicemanager.ManagerImpl
	records *records
	changed func()
	// refreshing serialises refresh: the kubelet calls back from one goroutine per plugin, and
	// a reading taken before a ListAndWatch update must not be written after that update's.
	refreshing sync.Mutex
}

func newPluginWatcher(manager *devicemanager.ManagerImpl, records *records, changed func()) *pluginWatcher {
	return &pluginWatcher{manager: manager, records: records, changed: changed}
}

// unexported reads or writes a field the device manager does not export.
func unexported(structPtr any, name string) (reflect.Value, error) {
	value := reflect.ValueOf(structPtr).Elem().FieldByName(name)
	if !value.IsValid() {
		return reflect.Value{}, errors.New("device manager has no field " + name + " (kubelet version changed?)")
	}
	return reflect.NewAt(value.Type(), unsafe.Pointer(value.UnsafeAddr())).Elem(), nil
}

// install puts the kubelet's registration server, built as NewManagerImpl builds it, in front
// of this watcher instead of in front of the manager alone. Call before manager.Start.
func (w *pluginWatcher) install(logger klog.Logger) error {
	server, err := plugin.NewServer(logger, pluginapi.KubeletSocket, w.manager, w)
	if err != nil {
		return err
	}
	field, err := unexported(w.manager, "server")
	if err != nil {
		return err
	}
	field.Set(reflect.ValueOf(server))
	return nil
}

// options reads the options the manager fetched from a connected plugin, under the manager's
// own lock: two plugins registering at once write the endpoints map while this reads it, and Go
// ends the process on such a concurrent map read ("concurrent map read and map write", seen in
// the kubelet-storm scenario). Nothing holds that lock while calling back into this watcher.
func (w *pluginWatcher) options(resource string) *pluginapi.DevicePluginOptions {
	mutex, err := unexported(w.manager, "mutex")
	if err != nil {
		return nil
	}
	lock := mutex.Addr().Interface().(*sync.Mutex)
	lock.Lock()
	defer lock.Unlock()
	endpoints, err := unexported(w.manager, "endpoints")
	if err != nil {
		return nil
	}
	info := endpoints.MapIndex(reflect.ValueOf(resource))
	if !info.IsValid() {
		return nil
	}
	copied := reflect.New(info.Type()).Elem()
	copied.Set(info)
	opts, err := unexported(copied.Addr().Interface(), "opts")
	if err != nil || opts.IsNil() {
		return nil
	}
	return opts.Interface().(*pluginapi.DevicePluginOptions)
}

func (w *pluginWatcher) PluginConnected(ctx context.Context, resource string, p plugin.DevicePlugin) error {
	if err := w.manager.PluginConnected(ctx, resource, p); err != nil {
		return err
	}
	reg := registration{Resource: resource, Endpoint: filepath.Base(p.SocketPath()), Time: time.Now().UTC()}
	if opts := w.options(resource); opts != nil {
		reg.PreStartRequired = opts.PreStartRequired
		reg.GetPreferredAllocationAvailable = opts.GetPreferredAllocationAvailable
	}
	w.records.addRegistration(reg)
	w.records.setConnected(resource, true)
	w.refresh()
	return nil
}

// disconnected records a plugin's disconnection (PluginDisconnected, per version, calls it).
func (w *pluginWatcher) disconnected(resource string) {
	w.records.setConnected(resource, false)
	w.refresh()
}

func (w *pluginWatcher) PluginListAndWatchReceiver(logger klog.Logger, resource string, resp *pluginapi.ListAndWatchResponse) {
	w.manager.PluginListAndWatchReceiver(logger, resource, resp)
	w.refresh()
}

// refresh records the healthy devices and asks the node to post its capacity.
func (w *pluginWatcher) refresh() {
	w.refreshing.Lock()
	defer w.refreshing.Unlock()
	healthy := map[string][]string{}
	for resource, devices := range allocatableDevices(w.manager) {
		for id := range devices {
			healthy[resource] = append(healthy[resource], id)
		}
	}
	w.records.setHealthy(healthy)
	w.changed()
}
