"""Kubernetes, on paper: a run as a Kubeflow Trainer TrainJob, its manifest only (manifest.py);
nothing submits it or reads it back (docs/guides/kubernetes.md)."""
