"""A run's Kubeflow Trainer TrainJob (scheduling/kubernetes/manifest.py) against the CRD's
published schema, offline: tests/data/trainjob-schema.json, vendored from kubeflow/trainer (its
$comment names the commit). No cluster, no apiserver.

The CRD's schema leaves out additionalProperties, as Kubernetes' structural schemas do: an
apiserver drops an unknown field, and `kubectl apply --validate=strict` refuses it. strict()
makes that refusal here, so a misspelt field fails. Not checked offline: the CEL rules
(x-kubernetes-validations) and the Trainer's webhook, but for the one rule of its that a
manifest of ours could break (PET_* set by hand).

Made with the `fetch` tool's mirror of github:kubeflow/trainer at the commit the file names:
    git show <commit>:manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml | python -c '
    import json, sys, yaml
    crd = yaml.safe_load(sys.stdin)
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    def strip(n):  # prose only: a field named "description" (under properties) stays
        if isinstance(n, list): return [strip(x) for x in n]
        if not isinstance(n, dict): return n
        return {k: ({f: strip(s) for f, s in x.items()} if k == "properties" else strip(x))
                for k, x in n.items() if not (k == "description" and isinstance(x, str))}
    print(json.dumps(strip(v["schema"]["openAPIV3Schema"]), indent=1, sort_keys=True))'
then $comment and x-crd (the CRD's spec.group/v1alpha1 and spec.names.kind) added by hand.
"""

from __future__ import annotations

import copy
import io
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from django.core.management import CommandError, call_command

from dashboard.experiments.scheduling.kubernetes.manifest import trainjob_render
from dashboard.experiments.scheduling.slurm.jobs import batch_script

SCHEMA = json.loads((Path(__file__).parent / "data" / "trainjob-schema.json").read_text())
# The CRD leaves metadata to the apiserver's ObjectMeta: the fields a manifest of ours may have.
OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
# The Trainer's webhook refuses a TrainJob that sets these itself (its TorchRunReservedEnvNames).
RESERVED_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                "PET_MASTER_PORT"}  # fmt: skip


def strict(node: Any) -> Any:
    """The schema with every object that lists its properties closed to others (unless it says
    it keeps unknown fields): what `kubectl apply --validate=strict` refuses."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: ({name: strict(sub) for name, sub in value.items()} if key == "properties"
                 else strict(value)) for key, value in node.items()}  # fmt: skip
    keeps = node.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in node and "additionalProperties" not in node and not keeps:
        out["additionalProperties"] = False
    return out


def schema_errors(manifest: dict[str, Any], *, closed: bool = True) -> list[str]:
    schema = copy.deepcopy(SCHEMA)
    schema["properties"]["metadata"] = OBJECT_META
    validator = jsonschema.Draft202012Validator(strict(schema) if closed else schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(manifest)]  # fmt: skip


@pytest.fixture
def k8s_settings(settings: Any) -> Any:
    settings.TRAINYARD_K8S_IMAGE = "registry.example.com/trainyard:1.4"
    settings.TRAINYARD_K8S_NAMESPACE = "ml"
    settings.TRAINYARD_K8S_QUEUE = "team-a"
    settings.TRAINYARD_K8S_SECRET = "trainyard-env"
    settings.TRAINYARD_K8S_CLAIM = "trainyard-shared"
    settings.TRAINYARD_RUNS_DIR = Path("/srv/trainyard/runs")
    settings.TRAINYARD_DATA_DIR = Path("/srv/trainyard/data")
    settings.SECRET_KEY = "a-key-that-must-stay-in-its-secret"
    return settings


@pytest.mark.django_db
def test_a_two_node_gpu_run_is_a_valid_trainjob(k8s_settings: Any, alice: Any,
                                                 experiment_factory: Any) -> None:  # fmt: skip
    run = experiment_factory(owner=alice, nodes=2, processes=4, gpus=[0, 1, 2, 3],
                             time_limit_minutes=90)  # fmt: skip
    manifest = trainjob_render(experiment=run)

    assert schema_errors(manifest) == []
    assert (manifest["apiVersion"], manifest["kind"]) == (SCHEMA["x-crd"]["apiVersion"],
                                                          SCHEMA["x-crd"]["kind"])  # fmt: skip
    assert manifest["metadata"] == {"name": f"ty-{run.pk}", "namespace": "ml",
                                    "labels": {"kueue.x-k8s.io/queue-name": "team-a"}}  # fmt: skip
    spec = manifest["spec"]
    assert spec["runtimeRef"] == {"name": "torch-distributed"}
    assert spec["activeDeadlineSeconds"] == 90 * 60
    trainer = spec["trainer"]
    assert trainer["image"] == "registry.example.com/trainyard:1.4"
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)
    assert trainer["resourcesPerNode"] == {"requests": {"cpu": 4},
                                           "limits": {"nvidia.com/gpu": 4}}  # fmt: skip
    # The supervisor the Slurm job execs, from the image's interpreter and WORKDIR.
    slurm_exec = shlex.split(batch_script(experiment_id=run.pk).splitlines()[-1])
    assert slurm_exec[3:] == ["slurm_job", str(run.pk)]
    assert trainer["command"] == ["python", "manage.py", *slurm_exec[3:]]
    env = {item["name"]: item for item in trainer["env"]}
    assert not RESERVED_ENV & env.keys()  # rendezvous comes from the runtime's PET_*
    assert env["DATABASE_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "trainyard-env", "key": "DATABASE_URL"}
    }
    assert env["TRAINYARD_RUNS_DIR"]["value"] == "/srv/trainyard/runs"
    assert "a-key-that-must-stay-in-its-secret" not in json.dumps(manifest)
    (patch,) = spec["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "trainyard", "persistentVolumeClaim": {"claimName": "trainyard-shared"}}
    ]
    assert [(m["mountPath"], m["subPath"]) for m in pod["containers"][0]["volumeMounts"]] == [
        ("/srv/trainyard/runs", "runs"), ("/srv/trainyard/data", "data")]  # fmt: skip


@pytest.mark.django_db
def test_a_cpu_run_without_queue_or_limit_leaves_those_fields_out(
    k8s_settings: Any, alice: Any, experiment_factory: Any
) -> None:
    k8s_settings.TRAINYARD_K8S_QUEUE = ""
    run = experiment_factory(owner=alice, nodes=1, processes=2)
    manifest = trainjob_render(experiment=run)
    assert schema_errors(manifest) == []
    assert "labels" not in manifest["metadata"]
    assert "activeDeadlineSeconds" not in manifest["spec"]
    assert manifest["spec"]["trainer"]["resourcesPerNode"] == {"requests": {"cpu": 2}}


@pytest.mark.django_db
def test_the_schema_refuses_a_wrong_manifest(k8s_settings: Any, alice: Any,
                                             experiment_factory: Any) -> None:  # fmt: skip
    good = trainjob_render(experiment=experiment_factory(owner=alice, nodes=2, gpus=[0]))

    def broken(change: Any) -> list[str]:
        manifest = copy.deepcopy(good)
        change(manifest)
        return schema_errors(manifest)

    # A misspelt field: the CRD's schema alone takes it (an apiserver would drop it)...
    typo = copy.deepcopy(good)
    typo["spec"]["trainer"]["numNode"] = typo["spec"]["trainer"].pop("numNodes")
    assert schema_errors(typo, closed=False) == []
    # ... strict validation refuses it, at any depth.
    assert broken(lambda m: m["spec"]["trainer"].update(numNode=2)) == [
        "spec.trainer: Additional properties are not allowed ('numNode' was unexpected)"
    ]
    mount = "spec.runtimePatches.0.trainingRuntimeSpec.template.spec.replicatedJobs.0.template"
    assert any(e.startswith(mount) and "'mountpath' was unexpected" in e for e in broken(
        lambda m: m["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        ["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
        ["volumeMounts"][0].update(mountpath="/x")))  # fmt: skip
    assert broken(lambda m: m["metadata"].update(label={"a": "b"})) != []
    # What the schema itself says: required fields, types, bounds.
    assert broken(lambda m: m["spec"].pop("runtimeRef")) == [
        "spec: 'runtimeRef' is a required property"
    ]
    assert broken(lambda m: m["spec"]["trainer"].update(numNodes="2")) == [
        "spec.trainer.numNodes: '2' is not of type 'integer'"
    ]
    assert broken(lambda m: m["spec"].update(activeDeadlineSeconds=0)) == [
        "spec.activeDeadlineSeconds: 0 is less than the minimum of 1"
    ]
    last = len(good["spec"]["trainer"]["env"])
    assert broken(lambda m: m["spec"]["trainer"]["env"].append({"value": "x"})) == [
        f"spec.trainer.env.{last}: 'name' is a required property"
    ]
    assert broken(lambda m: m["metadata"].update(name="ty_1")) != []


@pytest.mark.django_db
def test_the_command_prints_the_manifest_as_yaml(k8s_settings: Any, alice: Any,
                                                 experiment_factory: Any) -> None:  # fmt: skip
    run = experiment_factory(owner=alice, nodes=2)
    out = io.StringIO()
    call_command("k8s_manifest", str(run.pk), stdout=out)
    assert out.getvalue().startswith("# Trainyard run")
    assert yaml.safe_load(out.getvalue()) == trainjob_render(experiment=run)
    with pytest.raises(CommandError, match="no run"):
        call_command("k8s_manifest", str(run.pk + 1000), stdout=io.StringIO())
