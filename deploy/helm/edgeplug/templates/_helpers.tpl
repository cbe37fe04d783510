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
# Claims are read as the kubelet (agent/dra/claim_reads.py); empty: with the agent's token.
- name: KUBELET_CLIENT_CERT
  value: {{ include "edgeplug.kubeletClientCert" . | quote }}
{{- if and .Values.dra.kubeletCertDir .Values.dra.kubeletClientKey }}
- name: KUBELET_CLIENT_KEY
  value: {{ printf "%s/%s" .Values.dra.kubeletCertDir .Values.dra.kubeletClientKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "edgeplug.kubeletClientCert" -}}
{{- if .Values.dra.kubeletCertDir }}
{{- printf "%s/%s" .Values.dra.kubeletCertDir .Values.dra.kubeletClientCert }}
{{- end }}
{{- end }}

{{- define "edgeplug.agentDraMounts" -}}
{{- if .Values.dra.enabled }}
- name: dra-plugin
  mountPath: {{ printf "%s/edgeplug.io" .Values.dra.pluginsDir }}
- name: dra-registry
  mountPath: {{ .Values.dra.registryDir }}
{{- with .Values.dra.kubeletCertDir }}
# The whole directory, at its own path: the kubelet rotates its certificate by pointing
# kubelet-client-current.pem at a new file there (an absolute link).
- name: kubelet-pki
  mountPath: {{ . }}
  readOnly: true
{{- end }}
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
{{- with .Values.dra.kubeletCertDir }}
- name: kubelet-pki
  hostPath:
    path: {{ . }}
    type: Directory
{{- end }}
{{- end }}
{{- end }}
