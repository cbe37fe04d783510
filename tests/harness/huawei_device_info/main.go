// Reads a device-info ConfigMap's data (a JSON object of key to string, as
// `kubectl get cm -n kube-system mindx-dl-deviceinfo-<node> -o jsonpath='{.data}'` prints it)
// on stdin and checks it with Huawei's Ascend device plugin's own package: DeviceInfoCfg
// decodes into its NodeDeviceInfoCache with no unknown field, each -Fault list into its
// DeviceFault, CheckCode equals its MakeDataHash of DeviceInfo, and its json.Marshal gives back
// the very bytes written; a baseDeviceInfos key (the Node annotation) decodes into its
// NpuBaseInfo map and re-encodes to the same bytes. Prints OK or ERROR.
//
// Huawei's modules have no host in their names, so no module proxy serves them; with a
// checkout of github.com/Ascend/mind-cluster at .huawei/mind-cluster (the go.mod's replace
// lines point there):
//
//	go mod tidy && go build -o /tmp/huawei-device-info . && /tmp/huawei-device-info < data.json
//
// docs/handlers/ascend.md, "Volcano's view of the chips", says what it was run on.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"Ascend-device-plugin/pkg/common"
)

func main() {
	var data map[string]string
	if err := json.NewDecoder(os.Stdin).Decode(&data); err != nil {
		fmt.Println("ERROR stdin:", err)
		os.Exit(2)
	}
	if base, ok := data["baseDeviceInfos"]; ok { // the Node annotation, when given
		bd := json.NewDecoder(strings.NewReader(base))
		bd.DisallowUnknownFields()
		var infos map[string]common.NpuBaseInfo
		if err := bd.Decode(&infos); err != nil {
			fmt.Println("ERROR baseDeviceInfos:", err)
			os.Exit(1)
		}
		if again, err := json.Marshal(infos); err != nil || string(again) != base {
			fmt.Printf("ERROR baseDeviceInfos re-marshalled differs:\n%s\n%s\n", again, base)
			os.Exit(1)
		}
	}
	raw, ok := data["DeviceInfoCfg"]
	if !ok {
		fmt.Println("ERROR no DeviceInfoCfg key")
		os.Exit(1)
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	var info common.NodeDeviceInfoCache
	if err := dec.Decode(&info); err != nil {
		fmt.Println("ERROR DeviceInfoCfg:", err)
		os.Exit(1)
	}
	want := common.MakeDataHash(info.DeviceInfo)
	if want != info.CheckCode {
		fmt.Printf("ERROR CheckCode %q, Huawei's hash gives %q\n", info.CheckCode, want)
		os.Exit(1)
	}
	for key, value := range info.DeviceInfo.DeviceList {
		if strings.HasSuffix(key, "-Fault") {
			var faults []common.DeviceFault
			fd := json.NewDecoder(strings.NewReader(value))
			fd.DisallowUnknownFields()
			if err := fd.Decode(&faults); err != nil {
				fmt.Printf("ERROR %s: %v\n", key, err)
				os.Exit(1)
			}
		}
	}
	again, err := json.Marshal(info)
	if err != nil || string(again) != raw {
		fmt.Printf("ERROR re-marshalled differs:\n%s\n%s\n", again, raw)
		os.Exit(1)
	}
	fmt.Printf("OK %d device list keys, CheckCode %s\n", len(info.DeviceInfo.DeviceList), info.CheckCode)
}
