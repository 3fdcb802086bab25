"""Test data that several test files build the same way."""

from __future__ import annotations

import struct
from typing import Any

from django.test import Client

from training.registry import StrategyOption


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


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def float32(value: float) -> float:
    """What TensorBoard keeps of a value: its event files hold scalars as 32-bit floats."""
    return float(struct.unpack("f", struct.pack("f", value))[0])
