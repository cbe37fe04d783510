// cditool resolves CDI device names the way a CDI-enabled container runtime does, with the CDI
// project's own Go module (tags.cncf.io/container-device-interface): it loads every spec in the
// given directories, reports the ones that fail to parse or validate, and injects the requested
// devices into an empty OCI runtime spec, as containerd and CRI-O do at container creation.
//
// Usage:
//
//	cditool validate DIR...            -> JSON {"devices": [...], "errors": {file: [msg]}}
//	cditool resolve DIR... -- NAME...  -> JSON {"env": [...], "deviceNodes": [...], "mounts": [...]}
//
// resolve exits 1 with the runtime's error message when a name cannot be resolved.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type deviceNode struct {
	Path        string `json:"path"`
	Type        string `json:"type"`
	Major       int64  `json:"major"`
	Minor       int64  `json:"minor"`
	Permissions string `json:"permissions"`
}

type mount struct {
	Source      string   `json:"source"`
	Destination string   `json:"destination"`
	Options     []string `json:"options"`
}

type edits struct {
	Env         []string     `json:"env"`
	DeviceNodes []deviceNode `json:"deviceNodes"`
	Mounts      []mount      `json:"mounts"`
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func newCache(dirs []string) *cdi.Cache {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil && cache == nil {
		fail("cannot load CDI specs: %v", err)
	}
	return cache
}

func specErrors(cache *cdi.Cache) map[string][]string {
	out := map[string][]string{}
	for file, errs := range cache.GetErrors() {
		for _, err := range errs {
			out[file] = append(out[file], err.Error())
		}
	}
	return out
}

func validate(dirs []string) {
	cache := newCache(dirs)
	devices := cache.ListDevices()
	sort.Strings(devices)
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
		"devices": devices, "errors": specErrors(cache),
	})
}

func resolve(dirs, names []string) {
	cache := newCache(dirs)
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		fail("CDI device injection failed (unresolved %v): %v", unresolved, err)
	}
	result := edits{Env: spec.Process.Env, DeviceNodes: []deviceNode{}, Mounts: []mount{}}
	for _, d := range spec.Linux.Devices {
		result.DeviceNodes = append(result.DeviceNodes, deviceNode{
			Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor,
		})
	}
	if spec.Linux.Resources != nil {
		for i, rule := range spec.Linux.Resources.Devices {
			if i < len(result.DeviceNodes) && rule.Allow {
				result.DeviceNodes[i].Permissions = rule.Access
			}
		}
	}
	for _, m := range spec.Mounts {
		result.Mounts = append(result.Mounts, mount{
			Source: m.Source, Destination: m.Destination, Options: m.Options,
		})
	}
	_ = json.NewEncoder(os.Stdout).Encode(result)
}

func main() {
	if len(os.Args) < 3 {
		fail("usage: cditool validate DIR... | cditool resolve DIR... -- NAME...")
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "validate":
		validate(args)
	case "resolve":
		split := -1
		for i, a := range args {
			if a == "--" {
				split = i
				break
			}
		}
		if split < 1 || split == len(args)-1 {
			fail("usage: cditool resolve DIR... -- NAME...")
		}
		resolve(args[:split], args[split+1:])
	default:
		fail("unknown command %q", os.Args[1])
	}
}
