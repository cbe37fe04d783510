// Checks a device-info ConfigMap with Huawei's own types and hash: see main.go.
module huaweideviceinfo

go 1.26

require Ascend-device-plugin v0.0.0

// Huawei's modules are named without a host (Ascend-device-plugin, ascend-common), so no
// module proxy serves them: point these at a checkout of Ascend/mind-cluster.
replace Ascend-device-plugin => ../../../.huawei/mind-cluster/component/ascend-device-plugin

replace ascend-common => ../../../.huawei/mind-cluster/component/ascend-common
