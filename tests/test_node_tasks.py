"""The further nodes of a just-claimed multi-node attempt, as the task sends them (tasks.py)."""

from __future__ import annotations

from typing import Any

import pytest

from dashboard.experiments.models import Status
from dashboard.experiments.runs.nodes import NodeTask, nodes_further

pytestmark = pytest.mark.django_db


def test_each_further_node_goes_to_its_own_machine_for_this_attempt(
    experiment_factory: Any, user_factory: Any
) -> None:
    placement = [
        {"worker": "host-a", "node_rank": 0, "ranks": []},
        {"worker": "host-b", "node_rank": 1, "ranks": []},
        {"worker": "host-c", "node_rank": 2, "ranks": []},
    ]
    run = experiment_factory(owner=user_factory(), status=Status.RUNNING, attempt=2, nodes=3,
                             processes=1, worker="host-a", placement=placement)  # fmt: skip
    assert nodes_further(experiment_id=run.pk) == [
        NodeTask(experiment_id=run.pk, attempt=2, node_rank=1, machine="host-b"),
        NodeTask(experiment_id=run.pk, attempt=2, node_rank=2, machine="host-c"),
    ]


def test_a_run_on_one_machine_has_no_further_node(
    experiment_factory: Any, user_factory: Any
) -> None:
    alone = [{"worker": "host-a", "node_rank": 0, "ranks": []}]
    run = experiment_factory(
        owner=user_factory(), status=Status.RUNNING, attempt=1, placement=alone
    )
    assert nodes_further(experiment_id=run.pk) == []
    assert nodes_further(experiment_id=run.pk + 1000) == []  # gone: nothing to send
