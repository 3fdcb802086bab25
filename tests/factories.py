"""Test data that several test files build the same way."""

from __future__ import annotations

from typing import Any


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
        "zero_stage": "",
    }
    data.update({key: str(value) for key, value in fields.items()})
    return data
