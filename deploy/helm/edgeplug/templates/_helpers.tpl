{{/* Shared labels and image names. */}}
{{- define "edgeplug.labels" -}}
app.kubernetes.io/part-of: edgeplug
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "edgeplug.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s/%s:%s" $root.Values.image.registry (index . 1) (default $root.Chart.AppVersion $root.Values.image.tag) -}}
{{- end -}}


{{/* The agent's DRA settings, mounts and volumes (dra.enabled), the same in both agent
DaemonSets: ResourceSlices and the kubelet's DRA plugin (docs/dra.md). */}}
{{- define "edgeplug.agentDraEnv" -}}
{{- if .Values.dra.enabled }}
# ResourceSlices and the kubelet's DRA plugin (docs/dra.md).
- name: DRA
  value: "on"
- name: DRA_PLUGINS_DIR
  value: {{ .Values.dra.pluginsDir | quote }}
- name: DRA_REGISTRY_DIR
  value: {{ .Values.dra.registryDir | quote }}
# The liveness Lease the controller watches (agent/kube/liveness.py).
- name: LIVENESS_LEASE_NAMESPACE
  value: {{ .Release.Namespace | quote }}
{{- end }}
{{- end }}

{{- define "edgeplug.agentKubeletEnv" -}}
# This node's pods and claims are read as the kubelet (agent/kube/node_reads.py); empty: with the
# agent's token (deploy/token-reads).
- name: KUBELET_CLIENT_CERT
  value: {{ include "edgeplug.kubeletClientCert" . | quote }}
{{- if and .Values.agent.kubeletCertDir .Values.agent.kubeletClientKey }}
- name: KUBELET_CLIENT_KEY
  value: {{ printf "%s/%s" .Values.agent.kubeletCertDir .Values.agent.kubeletClientKey | quote }}
{{- end }}
# The Secrets and ConfigMaps Configurations name are read as this node's own account
# (agent/kube/node_account.py), in the release namespace's -nodes namespace.
- name: NODE_ACCOUNTS_NAMESPACE
  value: {{ printf "%s-nodes" .Release.Namespace | quote }}
{{- end }}

{{- define "edgeplug.kubeletClientCert" -}}
{{- if .Values.agent.kubeletCertDir }}
{{- printf "%s/%s" .Values.agent.kubeletCertDir .Values.agent.kubeletClientCert }}
{{- end }}
{{- end }}

{{- define "edgeplug.agentKubeletMounts" -}}
{{- with .Values.agent.kubeletCertDir }}
# The whole directory, at its own path: the kubelet rotates its certificate by pointing
# kubelet-client-current.pem at a new file there (an absolute link).
- name: kubelet-pki
  mountPath: {{ . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "edgeplug.agentKubeletVolumes" -}}
{{- with .Values.agent.kubeletCertDir }}
- name: kubelet-pki
  hostPath:
    path: {{ . }}
    type: Directory
{{- end }}
{{- end }}

{{- define "edgeplug.agentDraMounts" -}}
{{- if .Values.dra.enabled }}
- name: dra-plugin
  mountPath: {{ printf "%s/edgeplug.io" .Values.dra.pluginsDir }}
- name: dra-registry
  mountPath: {{ .Values.dra.registryDir }}
{{- end }}
{{- end }}

{{- define "edgeplug.agentDraVolumes" -}}
{{- if .Values.dra.enabled }}
- name: dra-plugin
  hostPath:
    path: {{ printf "%s/edgeplug.io" .Values.dra.pluginsDir }}
    type: DirectoryOrCreate
- name: dra-registry
  hostPath:
    path: {{ .Values.dra.registryDir }}
    type: DirectoryOrCreate
{{- end }}
{{- end }}
