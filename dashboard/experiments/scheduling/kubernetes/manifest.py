"""A run as a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1): the manifest that
`manage.py k8s_manifest <id>` prints for `kubectl apply -f -`.

A TrainJob rather than a bare JobSet: the Trainer's torch runtime (`torch-distributed`) already
makes the JobSet, a pod per node in its replicated job "node" behind a headless service, and
gives every node's container torchrun's rendezvous (PET_NNODES, PET_NPROC_PER_NODE,
PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT; its webhook refuses a TrainJob that sets them),
and Kueue queues a TrainJob by one label. What the run asks is what its Slurm job asks
(slurm/jobs.py): nodes, ranks per node with a core each, GPUs per node, the time limit, the name
`ty-<id>` and the same entry point, the run's supervisor (job_command.py).

The supervisor writes the run's rows and its pages' channel as a worker does, so it gets the
database's and Redis' URLs and the secret key from a Secret (never written into the manifest),
and the shared runs and data folders at the web host's paths, from one volume claim.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from dashboard.experiments.models import Experiment
from dashboard.experiments.scheduling.job_command import job_command, job_name

API_VERSION = "trainer.kubeflow.org/v1alpha1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource
# The runtime's replicated job and its trainer container (torch-distributed names both "node"):
# the volume is patched into them.
NODE = "node"
# The patch's owner (runtimePatches is a map keyed by it).
MANAGER = "trainyard"
SECRET_KEYS = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")
VOLUME = "trainyard"


def trainjob_render(*, experiment: Experiment) -> dict[str, Any]:
    """The run's TrainJob, as a dict in the CRD's field names."""
    metadata: dict[str, Any] = {
        "name": job_name(experiment.pk),
        "namespace": settings.TRAINYARD_K8S_NAMESPACE,
    }
    if settings.TRAINYARD_K8S_QUEUE:
        metadata["labels"] = {QUEUE_LABEL: settings.TRAINYARD_K8S_QUEUE}
    spec: dict[str, Any] = {
        "runtimeRef": {"name": settings.TRAINYARD_K8S_RUNTIME},
        "trainer": trainer_render(experiment=experiment),
        "runtimePatches": [{"manager": MANAGER, "trainingRuntimeSpec": volume_patch()}],
    }
    if experiment.time_limit_minutes:  # Slurm's --time; there is no warning before it here
        spec["activeDeadlineSeconds"] = experiment.time_limit_minutes * 60
    return {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}


def trainer_render(*, experiment: Experiment) -> dict[str, Any]:
    """The trainer: the image, the supervisor as its command (`python`, and manage.py in the
    image's WORKDIR), a pod per node, and a core per rank and the run's GPUs on each."""
    ranks = max(1, experiment.processes)
    resources: dict[str, Any] = {"requests": {"cpu": ranks}}
    if experiment.gpus:
        resources["limits"] = {GPU_RESOURCE: len(experiment.gpus)}
    return {
        "image": settings.TRAINYARD_K8S_IMAGE,
        "command": job_command(experiment_id=experiment.pk, python="python", manage="manage.py"),
        "numNodes": max(1, experiment.nodes),
        "numProcPerNode": ranks,
        "resourcesPerNode": resources,
        "env": env_render(),
    }


def env_render() -> list[dict[str, Any]]:
    """What the supervisor's settings need, a Slurm job's from the submitting environment: the
    secrets by reference, the web host's names and folders."""
    secret = settings.TRAINYARD_K8S_SECRET
    return [
        *({"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
          for key in SECRET_KEYS),
        {"name": "ALLOWED_HOSTS", "value": ",".join(settings.ALLOWED_HOSTS)},
        {"name": "TRAINYARD_RUNS_DIR", "value": str(settings.TRAINYARD_RUNS_DIR)},
        {"name": "TRAINYARD_DATA_DIR", "value": str(settings.TRAINYARD_DATA_DIR)},
    ]  # fmt: skip


def volume_patch() -> dict[str, Any]:
    """The claim on every node's pod, its runs/ and data/ at the web host's folders: the
    supervisor writes checkpoints and logs where the pages read them."""
    mounts = [
        {"name": VOLUME, "mountPath": str(settings.TRAINYARD_RUNS_DIR), "subPath": "runs"},
        {"name": VOLUME, "mountPath": str(settings.TRAINYARD_DATA_DIR), "subPath": "data"},
    ]
    pod = {
        "volumes": [
            {"name": VOLUME, "persistentVolumeClaim": {"claimName": settings.TRAINYARD_K8S_CLAIM}}
        ],
        "containers": [{"name": NODE, "volumeMounts": mounts}],
    }
    job = {"name": NODE, "template": {"spec": {"template": {"spec": pod}}}}
    return {"template": {"spec": {"replicatedJobs": [job]}}}
