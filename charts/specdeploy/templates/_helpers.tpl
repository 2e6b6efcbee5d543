{{/* Chart name, shortened to the 63 characters of a DNS label. */}}
{{- define "specdeploy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: <release>-specdeploy, or the release name if it contains the chart name. */}}
{{- define "specdeploy.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of cluster-scoped objects: unique per release namespace too, since two releases of the same name
may live in two namespaces. */}}
{{- define "specdeploy.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "specdeploy.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "specdeploy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of the operator pods (immutable in the Deployment). */}}
{{- define "specdeploy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specdeploy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "specdeploy.labels" -}}
helm.sh/chart: {{ include "specdeploy.chart" . }}
{{ include "specdeploy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: specdeploy
{{- end -}}

{{- define "specdeploy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "specdeploy.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator image: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "specdeploy.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Reference of a settings image ({repository, tag}); call with (list $ .Values.settings.serverImage). */}}
{{- define "specdeploy.settingsImage" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- if $img.repository -}}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* The engine-path server image: its tag defaults to appVersion-trtllm<TENSORRT pin> (trtllm-releases.env,
which tests/chart holds this default to). */}}
{{- define "specdeploy.engineServerImage" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- printf "%s:%s" $img.repository (default (printf "%s-trtllm1.2.1" $root.Chart.AppVersion) $img.tag) -}}
{{- end -}}

{{/* True ("true") when the operator runs more than one pod and therefore uses kopf peering. */}}
{{- define "specdeploy.peering" -}}
{{- if gt (int .Values.replicaCount) 1 -}}true{{- end -}}
{{- end -}}

{{/*
Rules the operator needs in every namespace it reconciles: used by the ClusterRole (cluster-wide mode) or by
one Role per watched namespace. Writes are server-side apply (PATCH; creating through apply is authorised as
`create` too). No Secrets: SpeculativeDeployments name them and the pods mount them.
*/}}
{{- define "specdeploy.namespacedRules" -}}
# The API of specdeploy.
- apiGroups: [specdeploy.dev]
  resources: [speculativedeployments]
  verbs: [get, list, watch]
- apiGroups: [specdeploy.dev]
  resources: [speculativedeployments/status]
  verbs: [patch]
- apiGroups: [specdeploy.dev]
  resources: [enginebuilds]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [specdeploy.dev]
  resources: [enginebuilds/status]
  verbs: [patch]
- apiGroups: [specdeploy.dev]
  resources: [drafttrainings]
  verbs: [get, list, watch]
- apiGroups: [specdeploy.dev]
  resources: [drafttrainings/status]
  verbs: [patch]
# Children carry ownerReferences with blockOwnerDeletion: clusters that run the OwnerReferencesPermissionEnforcement
# admission plugin (OpenShift) want update on the owner's finalizers from whoever sets it.
- apiGroups: [specdeploy.dev]
  resources: [speculativedeployments/finalizers, enginebuilds/finalizers, drafttrainings/finalizers]
  verbs: [update]
# Engine-build and draft-training Jobs, and their pods (read-only: a step's termination message).
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# Serving objects.
- apiGroups: [""]
  resources: [configmaps, services, persistentvolumeclaims]
  verbs: [get, list, watch, create, patch]
# delete: a change between one node and several per replica replaces the Deployment by a LeaderWorkerSet (and
# back) once the new one serves every replica.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# LeaderWorkerSets: the replicas that span nodes; harmless where the LeaderWorkerSet controller is not installed.
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, watch, create, patch, delete]
# KEDA ScaledObjects (spec.autoscaling.engine: keda); harmless where KEDA is not installed.
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, create, patch, delete]
# Events about the objects it handles; list: a build Job whose pod the API server refuses (PodSecurity, a
# ResourceQuota) says so only in its events, which the operator reads for that Job alone (field selector).
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch, list]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* Cluster-scoped reads of the kopf framework: resource discovery and namespace watching. */}}
{{- define "specdeploy.frameworkRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end -}}
