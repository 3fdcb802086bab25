"""Schemathesis against the live stack: requests generated from /api/schema/, for every route,
with a Bearer token; no 5xx, and every answer matches the schema (its status code, content type
and body). Twice: the suite's own loop over every operation (positive and negative cases, the
path ids pointed at seeded rows), and Schemathesis' own runner with its default phases
(coverage, fuzzing, stateful) and checks, as a user would run it.

The stack's worker is stopped while it runs, so the runs the generated launches and studies
queue never train; they are stopped at the end (a queued run is cancelled at once) and the
worker started again. Path ids are mostly the seeded rows' (a finished run with points, logs
and a checkpoint on disk; a queued run; a study), so the cases reach real rows, and sometimes
what Schemathesis drew (a 404).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.stack import Stack

# Cases per operation and generation mode: (23 operations today) x 2 modes x 15 = 690 cases, 40-90 s
# of requests on two loaded cores.
CASES = 15
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
USER = "fuzzer"
# Every failure whole (the response, the curl command that reproduces it), for the one reading.
ARTIFACT = Path(__file__).resolve().parent.parent / "test-artifacts" / "schemathesis-failures.txt"
SEED = """
import json
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
from dashboard.experiments.core.checkpoints import run_dir
from dashboard.experiments.models import Checkpoint, Experiment, LogLine, SeriesPoint, Status
owner = get_user_model().objects.get(username=%(user)r)
now = timezone.now()
run = Experiment.objects.create(
    owner=owner, name="seeded", status=Status.SUCCEEDED, strategy="ddp", processes=2,
    started_at=now - timedelta(seconds=60), finished_at=now, epoch=1, step=20, total_steps=20,
    test_accuracy=0.91, test_loss=0.3, worker="test-worker", tags=["seeded"],
)
SeriesPoint.objects.bulk_create(
    SeriesPoint(experiment=run, key=key, step=step, time=step * 0.5, value=1.0 / (step + 1))
    for key in ("train/loss", "train/accuracy") for step in range(1, 21)
)
LogLine.objects.bulk_create(
    LogLine(experiment=run, seq=seq, time=now.timestamp(), level="info", message=f"line {seq}",
            rank=seq %% 2)
    for seq in range(1, 11)
)
folder = run_dir(experiment_id=run.pk)
folder.mkdir(parents=True, exist_ok=True)
path = folder / "checkpoint-step20.pt"
path.write_bytes(b"seeded checkpoint")
Checkpoint.objects.create(experiment=run, epoch=1, step=20, path=str(path), size=17,
                          worker="test-worker")
queued = Experiment.objects.create(owner=owner, name="waiting", status=Status.QUEUED)
print(json.dumps({"run": run.pk, "step": 20, "queued": queued.pk}))
"""


@dataclass
class Tally:
    cases: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    failures: dict[str, list[str]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def live(stack: Stack) -> Iterator[tuple[Stack, str, dict[str, int]]]:
    stack.user_create(USER)
    key = stack.manage("create_token", USER).strip().split()[-1]
    rows = json.loads(stack.manage("shell", "-c", SEED % {"user": USER}).strip().splitlines()[-1])
    stack.services.pop("worker").stop()  # nothing the cases queue may start training
    auth = {"Authorization": f"Bearer {key}"}
    study = requests.post(
        f"{stack.base_url}/api/studies/",
        json={"name": "seeded study", "axes": {"seed": [1, 2]}, "target_accuracy": 0.9},
        headers=auth,
        timeout=30,
    )
    assert study.status_code == 201, study.text
    rows["study"] = study.json()["id"]
    try:
        yield stack, key, rows
    finally:
        _queued_runs_stop(stack, auth)
        stack.worker_start()


def _queued_runs_stop(stack: Stack, auth: dict[str, str]) -> None:
    # A page at a time until none is left: the stateful phase may queue more than a page.
    while runs := requests.get(
        f"{stack.base_url}/api/experiments/?status=queued&limit=500", headers=auth, timeout=60
    ).json()["experiments"]:
        for run in runs:
            stop = requests.post(run_url(stack, run["id"]) + "stop/", headers=auth, timeout=30)
            assert stop.status_code == 202, stop.text


def run_url(stack: Stack, pk: int) -> str:
    return f"{stack.base_url}/api/experiments/{pk}/"


def path_ids(case: Any, rows: dict[str, int]) -> None:
    """Three cases in four reach the seeded rows; the fourth keeps what was drawn."""
    params = case.path_parameters or {}
    drawn = params.get("pk")
    if not isinstance(drawn, int) or drawn % 4 == 0:
        return
    path = case.operation.path
    if path.startswith("/api/studies/"):
        params["pk"] = rows["study"]
    elif path.startswith("/api/queue/"):
        params["pk"] = rows["queued"]
    else:
        params["pk"] = rows["run"]
    if "step" in params:
        params["step"] = rows["step"]


def operation_fuzz(operation: Any, *, live: Any, tally: Tally, mode: Any) -> None:
    stack, key, rows = live
    label = f"{operation.method.upper()} {operation.path}"
    session = requests.Session()

    @settings(
        max_examples=CASES,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases every run: a failure here is one to reproduce
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        path_ids(case, rows)
        tally.cases[label] += 1
        response = case.call(
            base_url=stack.base_url,
            session=session,
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        tally.statuses[response.status_code] += 1
        # No exception for the server's own refusals: daphne's and Twisted's are the API's JSON
        # under /api/ too (dashboard/http_server.py), so the checks below hold for them.
        try:
            case.validate_response(response, checks=CHECKS)
        except (Exception, BaseExceptionGroup) as failure:  # gathered, shown all at once
            checks = [line for line in str(failure).splitlines() if line.startswith("- ")]
            found = f"{case.method} {case.formatted_path} -> {response.status_code}: {checks}"
            tally.failures.setdefault(label, []).append(found[:300])
            with ARTIFACT.open("a") as out:
                out.write(f"== {found}\n{failure}\n\n")

    one()


# sqlite_only: on PostgreSQL the default phases' run below reaches every operation too (its
# coverage phase) and fuzzes each, which is where a value one engine refuses would show.
@pytest.mark.sqlite_only
def test_schemathesis_every_route(live: Any) -> None:
    stack, key, _ = live
    schema = schemathesis.openapi.from_url(
        f"{stack.base_url}/api/schema/", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    tally = Tally()
    ARTIFACT.parent.mkdir(exist_ok=True)
    ARTIFACT.write_text("")
    started = time.monotonic()
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results), [r for r in results if not isinstance(r, Ok)]
    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            operation_fuzz(operation, live=live, tally=tally, mode=mode)
    seconds = time.monotonic() - started
    print(
        f"\nSchemathesis: {sum(tally.cases.values())} cases over {len(operations)} operations "
        f"({len(schema.raw_schema['paths'])} paths) in {seconds:.0f} s; statuses "
        f"{dict(sorted(tally.statuses.items()))}; failures in {len(tally.failures)} operations"
    )
    assert len(operations) >= 20
    assert set(tally.cases) == {f"{o.method.upper()} {o.path}" for o in operations}
    assert not any(status >= 500 for status in tally.statuses)
    assert not tally.failures, "\n\n".join(
        f"{label}:\n  " + "\n  ".join(found[:3]) for label, found in tally.failures.items()
    )


# Schemathesis' own run, as a user would start it (`schemathesis run URL/api/schema/ -H
# "Authorization: Bearer KEY"`): its default phases (examples, coverage, fuzzing, stateful: links
# between operations, e.g. a launch's id into stop and logs) and its default checks. One check
# is left out: positive_data_acceptance (a schema-valid request must be accepted) cannot hold
# for rules OpenAPI does not express, which the API keeps where they are (the launch form, the
# study grid): `from` not above `to`, GPU ids this worker has, page cursors the list gave, a
# file that is a TensorBoard log or a CSV. negative_data_rejection (a request the schema calls
# invalid must be refused) stays: each parameter documents what the route takes.
# --request-timeout: its default is 10 s, and a launch on two cores that train beside it took
# longer once (2026-12-05, a Network Error of the Coverage phase); the suite's own requests wait 30.
DEFAULT_RUN_FLAGS = [
    "-n", "25", "--seed", "20", "--exclude-checks", "positive_data_acceptance",
    "--request-timeout", "30",
]  # fmt: skip


# postgres_only: make test's SQLite pass fuzzes every route with the loop above; this run's
# coverage and fuzzing phases go where a value one engine refuses shows (PostgreSQL's text has no
# NUL character, its integers their widths), and its stateful links need no second engine.
@pytest.mark.postgres_only
def test_schemathesis_default_phases(live: Any, tmp_path: Path) -> None:
    """Its own runner, 25 examples per operation; ~60-80 s of requests on two loaded cores."""
    stack, key, _ = live
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{stack.base_url}/api/schema/",
        "-H", f"Authorization: Bearer {key}", *DEFAULT_RUN_FLAGS,
        "--report", "junit", "--report-dir", str(tmp_path), "--output-truncate", "false",
    ]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(  # noqa: S603
        command, capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path
    )
    summary = result.stdout.split("SUMMARY", 1)[-1].strip()
    print(f"\nSchemathesis run in {time.monotonic() - started:.0f} s:\n{summary[-1500:]}")
    ARTIFACT.parent.mkdir(exist_ok=True)
    ARTIFACT.with_name("schemathesis-run.txt").write_text(result.stdout + result.stderr)
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in summary, f"{phase} did not pass:\n{result.stdout[-6000:]}"
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
