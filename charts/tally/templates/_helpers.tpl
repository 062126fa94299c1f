{{/*
Labels on every object's metadata: the two manifests/kustomization.yaml adds (name, part-of) and
Helm's standard ones (instance, version, managed-by, chart), which tell which release owns what.
*/}}
{{- define "tally.labels" -}}
app.kubernetes.io/name: tally
app.kubernetes.io/part-of: tally
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
{{- end }}

{{/*
What selects tally's pods (Deployment, Services, PodDisruptionBudget, NetworkPolicy, the
anti-affinity): the same two labels as manifests/, and no release label, so that a Deployment
installed with kubectl can be taken over by the chart (a Deployment's selector is immutable).
*/}}
{{- define "tally.selectorLabels" -}}
app.kubernetes.io/name: tally
app.kubernetes.io/component: operator
{{- end }}

{{/*
The ServiceAccount every binding names.
*/}}
{{- define "tally.subject" -}}
- kind: ServiceAccount
  name: tally
  namespace: {{ .Release.Namespace }}
{{- end }}

{{/*
Values no schema can check: combinations.
*/}}
{{- define "tally.validate" -}}
{{- if and (not .Values.leaderElection.enabled) (gt (int .Values.replicaCount) 1) }}
{{- fail "leaderElection.enabled=false needs replicaCount=1: replicas without leader election would all run the controllers and write every quota's status" }}
{{- end }}
{{- if not (or .Values.webhook.mutualTLS.enabled .Values.webhook.allowedSources .Values.webhook.unauthenticated) }}
{{- fail "webhook.mutualTLS.enabled=false needs webhook.allowedSources (your control plane's addresses, docs/install.md \"Who may call the webhook\"): otherwise anything in the cluster can post forged reviews to tally's webhook and use up quotas (webhook.unauthenticated=true renders it anyway, for a throwaway cluster)" }}
{{- end }}
{{- end }}
