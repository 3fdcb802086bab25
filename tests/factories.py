"""Test data that several test files build the same way."""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import Status
from dashboard.experiments.runs.lifecycle import run_finish
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.templatetags import page_facts
from training import registry
from training.registry import StrategyOption, option_strategies


def form_data(**fields: Any) -> dict[str, str]:
    """A valid launch form post (as the browser sends it), with `fields` changed."""
    data = {
        "name": "",
        "dataset": "mnist",
        "strategy": "single",
        "processes": "",
        "gpus": "",
        "epochs": "1",
        "batch_size": "64",
        "lr": "0.001",
        "optimizer": "adam",
        "seed": "1",
    }
    data.update({key: str(value) for key, value in fields.items()})
    return data


def value_off_default(option: StrategyOption) -> Any:
    """A value of `option` other than its default that runs on the CPU too: what a test asks
    for to see the option taken (or refused by a strategy that does not read it)."""
    return next(v for v in option.values if v != option.default and not option.gpu_reason(v))


# Strategies a CPU test machine launches without more (no GPUs, no optional package), in the
# order a reader or a non-reader is picked.
CPU_STRATEGIES = ("ddp", "single", "fsdp", "deepspeed", "model-parallel", "hogwild")


def reader_attach(option: StrategyOption, monkeypatch: pytest.MonkeyPatch) -> str:
    """A strategy that reads `option` and runs on the CPU: the registry's, else ddp with the
    option attached for this test alone (no strategy reads it on this branch yet)."""
    readers = option_strategies(option)
    found = next((name for name in CPU_STRATEGIES if name in readers), None)
    if found is not None:
        return found
    spec = registry.STRATEGIES["ddp"]
    attached = dataclasses.replace(spec, options=(*spec.options, option))
    monkeypatch.setitem(registry.STRATEGIES, "ddp", attached)
    patched = tuple(attached if s.name == "ddp" else s for s in registry.REGISTRY)
    # The modules that bound the registry's tuple by name read the attached spec too.
    for module in (registry, page_facts):
        monkeypatch.setattr(module, "REGISTRY", patched)
    return "ddp"


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def asked_then_ended(run: Any, ask: Callable[[Client, Any], Any]) -> Client:
    """A running ``run`` that its owner asked something of (``ask`` posts the request: a
    checkpoint, a profile; answered 202), ended (succeeded) before any rank answered. The owner's
    client comes back, to read what is left of the request."""
    client = logged_in(run.owner)
    assert ask(client, run).status_code == 202
    run.refresh_from_db()
    run_finish(experiment=run, sink=EventSink(run), outcome=Outcome(Status.SUCCEEDED))
    return client


def float32(value: float) -> float:
    """What TensorBoard keeps of a value: its event files hold scalars as 32-bit floats."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def api_post(client: Client, body: dict[str, Any]) -> Any:
    """A launch through the JSON API as a browser session sends it."""
    return client.post("/api/experiments/", json.dumps(body), content_type="application/json")
