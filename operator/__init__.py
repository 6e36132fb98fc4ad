"""The Kubernetes operator: PerfDiagnosis handlers, the pod webhook, coordination."""
