"""The seven strategies in the launch form, the API, the capacity rules and the training command."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from dashboard.devices.capacity import capacity_check
from dashboard.experiments.core.forms import ExperimentForm
from dashboard.experiments.models import Experiment, Strategy, ZeroStage
from dashboard.experiments.runs.runner import training_command
from dashboard.experiments.templatetags.page_facts import page_facts_build
from tests.factories import api_post, form_data, value_off_default
from tests.test_devices import machine_make
from training import cli
from training.config import parse_args
from training.refusals import RULE_MIN_GPUS, strategy_refusals
from training.registry import OPTIONS_DECLARED, REGISTRY, ZERO_STAGE, StrategySpec

pytestmark = pytest.mark.django_db

NEW_STRATEGIES = (
    "dp-primitives", "model-parallel", "hogwild", "deepspeed", "fsdp", "pipeline",
    "tensor-parallel", "fsdp-tp",
)  # fmt: skip


# --- choices and help -------------------------------------------------------------------------


def test_every_strategy_is_a_choice_with_one_help_line() -> None:
    # A user's own script too (tests/test_script_launch.py): the API's, not the form's yet.
    assert set(Strategy.values) == {"single", "dp", "ddp", *NEW_STRATEGIES, "script"}
    help_lines = {spec.name: spec.help for spec in REGISTRY}
    assert set(help_lines) == set(Strategy.values)
    for line in help_lines.values():
        assert "\n" not in line and 40 < len(line) < 240


def test_form_page_has_a_field_per_declared_option(client: Client, user_factory: Any) -> None:
    client.force_login(user_factory())
    response = client.get(reverse("experiment-new"))
    html = response.content.decode()
    for option in OPTIONS_DECLARED:
        assert f'name="{option.name}"' in html
    assert html.count('class="field strategy-option"') == len(OPTIONS_DECLARED)
    processes = "ddp hogwild deepspeed fsdp pipeline tensor-parallel fsdp-tp"
    assert f'data-process-strategies="{processes}"' in html
    for value in NEW_STRATEGIES:
        assert f'<option value="{value}"' in html


# --- the form: defaults and normalisation -----------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "processes", "zero_stage"),
    [
        ({"strategy": "model-parallel"}, 1, None),
        ({"strategy": "hogwild"}, 2, None),
        ({"strategy": "hogwild", "processes": 1}, 1, None),
        ({"strategy": "deepspeed"}, 2, 1),
        ({"strategy": "deepspeed", "zero_stage": 2}, 2, 2),
        # A stage left at its default while switching away from DeepSpeed is dropped, like
        # processes; another one is refused (test_option_fields).
        ({"strategy": "ddp", "zero_stage": 1}, 2, None),
        ({"strategy": "single", "processes": 5}, 1, None),
    ],
)
def test_form_accepts_the_strategies_on_cpu(
    fields: dict[str, Any], processes: int, zero_stage: int | None
) -> None:
    machine_make(hostname="cpu-box", cpu_count=4)
    form = ExperimentForm(form_data(**fields))
    assert form.is_valid(), form.errors
    assert form.cleaned_data["processes"] == processes
    assert form.cleaned_data["zero_stage"] == zero_stage
    assert form.cleaned_data["name"]


def test_form_accepts_gpu_strategies_where_the_gpus_are() -> None:
    machine_make(hostname="gpu-node-1", cpu_count=8, gpu_ids=(0, 1))
    for fields in (
        {"strategy": "dp-primitives", "gpus": "0,1"},
        {"strategy": "model-parallel", "gpus": "0"},
        {"strategy": "model-parallel", "gpus": "0,1"},
        {"strategy": "deepspeed", "gpus": "0,1", "zero_stage": "2"},
    ):
        form = ExperimentForm(form_data(**fields))
        assert form.is_valid(), (fields, form.errors)
    form = ExperimentForm(form_data(strategy="deepspeed", gpus="0,1"))
    assert form.is_valid() and form.cleaned_data["processes"] == 2


# --- refusals that say what is available ------------------------------------------------------


def test_dp_primitives_on_a_cpu_only_cluster_names_what_there_is() -> None:
    machine_make(hostname="cpu-box", cpu_count=4)
    machine_make(hostname="one-gpu", cpu_count=4, gpu_ids=(0,))
    form = ExperimentForm(form_data(strategy="dp-primitives"))
    assert not form.is_valid()
    [message] = form.errors["gpus"]
    assert "at least 2 GPUs on one machine" in message
    assert "no GPU ids were given" in message
    assert "the largest worker (one-gpu) has GPU 0" in message


def test_dp_primitives_with_one_gpu_points_at_the_machine_with_two() -> None:
    machine_make(hostname="gpu-node-1", gpu_ids=(0, 1, 2))
    assert capacity_check(strategy="dp-primitives", processes=1, gpus=[1]) == [
        "DataParallel primitives need at least 2 GPUs on one machine (got GPU 1): "
        "gpu-node-1 has GPUs 0, 1, 2"
    ]
    assert capacity_check(strategy="dp-primitives", processes=1, gpus=[0, 2]) == []


def test_model_parallel_takes_at_most_two_gpus() -> None:
    machine_make(hostname="gpu-node-1", gpu_ids=(0, 1, 2))
    [message] = capacity_check(strategy="model-parallel", processes=1, gpus=[0, 1, 2])
    assert "2 stages: give 0, 1 or 2 GPU ids" in message and "not 3 (GPUs 0, 1, 2)" in message
    assert capacity_check(strategy="model-parallel", processes=1, gpus=[]) == []


def test_hogwild_and_deepspeed_processes_fit_the_cores() -> None:
    machine_make(hostname="host-a", cpu_count=4)
    assert capacity_check(strategy="hogwild", processes=4, gpus=[]) == []
    assert capacity_check(strategy="hogwild", processes=6, gpus=[]) == [
        "Hogwild asks for 6 processes but the largest worker (host-a) has 4 CPU cores and no GPU"
    ]
    assert capacity_check(strategy="deepspeed", processes=5, gpus=[]) == [
        "DeepSpeed asks for 5 processes but the largest worker (host-a) has 4 CPU cores and no GPU"
    ]


def test_hogwild_refuses_gpus_and_deepspeed_wants_one_process_per_gpu() -> None:
    machine_make(hostname="gpu-node-1", gpu_ids=(0, 1))
    [message] = capacity_check(strategy="hogwild", processes=2, gpus=[0])
    assert "Hogwild trains on the CPU" in message and "got GPU 0" in message
    assert capacity_check(strategy="deepspeed", processes=3, gpus=[0, 1]) == [
        "DeepSpeed runs one process per GPU: 3 processes for 2 GPUs (GPUs 0, 1)"
    ]
    assert capacity_check(strategy="deepspeed", processes=2, gpus=[0, 2]) == [
        "GPU 2 does not exist: gpu-node-1 has GPUs 0, 1"
    ]


# --- one rule, two audiences: the CLI and the dashboard read training/registry.py ----------


@pytest.mark.parametrize(
    ("strategy", "processes", "gpus"),
    [
        ("ddp", 4, [0, 1]),
        ("deepspeed", 3, [0, 1]),
        ("hogwild", 2, [0]),
        ("single", 1, [0, 1]),
        ("model-parallel", 1, [0, 1, 2]),
    ],
)
def test_cli_and_dashboard_refuse_the_same_combinations(
    capsys: pytest.CaptureFixture[str], strategy: str, processes: int, gpus: list[int]
) -> None:
    machine_make(hostname="gpu-node-1", gpu_ids=(0, 1, 2))
    [refusal] = strategy_refusals(strategy, processes=processes, gpus=gpus)
    assert capacity_check(strategy=strategy, processes=processes, gpus=gpus) == [refusal.message]
    ids = ",".join(str(i) for i in gpus)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--strategy", strategy, "--nproc", str(processes), "--gpus", ids])
    assert exc.value.code == 2
    assert refusal.cli_message in capsys.readouterr().err


def test_a_gpu_minimum_is_said_with_the_machines_that_have_enough() -> None:
    [refusal] = strategy_refusals("dp-primitives", processes=1, gpus=[1])
    assert refusal.rule == RULE_MIN_GPUS
    machine_make(hostname="gpu-node-1", gpu_ids=(0, 1, 2))
    [message] = capacity_check(strategy="dp-primitives", processes=1, gpus=[1])
    assert message == f"{refusal.message}: gpu-node-1 has GPUs 0, 1, 2"
    assert strategy_refusals("dp-primitives", processes=1, gpus=[0, 1]) == []


# --- the API ----------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["model-parallel", "hogwild", "deepspeed"])
def test_api_launches_the_cpu_strategies(api: Client, launched: list[int], strategy: str) -> None:
    machine_make(hostname="cpu-box", cpu_count=4)
    response = api_post(api, {"strategy": strategy})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["strategy"] == strategy
    assert body["zero_stage"] == (1 if strategy == "deepspeed" else None)
    assert body["processes"] == (1 if strategy == "model-parallel" else 2)


def test_api_takes_a_zero_stage(api: Client, launched: list[int]) -> None:
    machine_make(hostname="cpu-box", cpu_count=4)
    response = api_post(api, {"strategy": "deepspeed", "zero_stage": 2, "processes": 3})
    assert response.status_code == 201, response.content
    assert Experiment.objects.get(pk=response.json()["id"]).zero_stage == 2


@pytest.mark.parametrize(
    ("payload", "field", "words"),
    [
        ({"strategy": "deepspeed", "zero_stage": 3}, "zero_stage", "1 or 2"),
        ({"strategy": "deepspeed", "zero_stage": "2"}, "zero_stage", "integer"),
        ({"strategy": "deepspeed", "zero_stage": True}, "zero_stage", "integer"),
        ({"strategy": "dp-primitives"}, "gpus", "2 GPUs"),
        ({"strategy": "hogwild", "processes": 64}, "processes", "4 CPU cores"),
        ({"strategy": "model-parallel", "gpus": [0, 1, 2]}, "gpus", "2 stages"),
        ({"strategy": "deepspeed", "gpus": [0, 1], "processes": 1}, "processes", "per GPU"),
    ],
)
def test_api_refuses_bad_combinations(
    api: Client, launched: list[int], payload: dict[str, Any], field: str, words: str
) -> None:
    machine_make(hostname="cpu-box", cpu_count=4)
    response = api_post(api, payload)
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert field in errors, errors
    assert words in errors[field][0], errors
    assert not Experiment.objects.exists() and not launched


# --- the training command ---------------------------------------------------------------------


def _flags(command: list[str]) -> dict[str, str]:
    return {
        flag: command[i + 1]
        for i, flag in enumerate(command)
        if flag.startswith("--") and i + 1 < len(command)
    }


@pytest.mark.parametrize(
    ("fields", "nproc", "zero"),
    [
        ({"strategy": "single", "processes": 1}, None, None),
        ({"strategy": "dp", "processes": 1, "gpus": [0, 1]}, None, None),
        ({"strategy": "dp-primitives", "processes": 1, "gpus": [0, 1]}, None, None),
        ({"strategy": "model-parallel", "processes": 1}, None, None),
        ({"strategy": "ddp", "processes": 3}, "3", None),
        ({"strategy": "hogwild", "processes": 4}, "4", None),
        ({"strategy": "deepspeed", "processes": 2, "zero_stage": 2}, "2", "2"),
        ({"strategy": "deepspeed", "processes": 2, "zero_stage": None}, "2", "1"),
    ],
)
def test_training_command_per_strategy(
    user_factory: Any,
    experiment_factory: Any,
    fields: dict[str, Any],
    nproc: str | None,
    zero: str | None,
) -> None:
    experiment = experiment_factory(owner=user_factory(), **fields)
    command = training_command(experiment=experiment)
    flags = _flags(command)
    assert command[1:3] == ["-m", "training"]
    assert flags["--strategy"] == fields["strategy"]
    assert flags.get("--nproc") == nproc
    assert flags.get("--zero-stage") == zero
    if fields.get("gpus"):
        assert flags["--gpus"] == ",".join(str(g) for g in fields["gpus"])
    assert flags["--checkpoint-dir"].endswith(f"{experiment.pk}/checkpoints")


def test_cli_says_a_gpu_minimum_with_this_machines_gpus(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    # As on a machine with two GPUs: the CLI asks torch for the count, and nothing runs.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--strategy", "dp-primitives", "--gpus", "1"])
    assert exc.value.code == 2
    assert (
        "--strategy dp-primitives needs --gpus with two or more ids (this machine has 2 GPUs, "
        "e.g. --gpus 0,1)"
    ) in capsys.readouterr().err


# --- a strategy's own options (ZeRO's stage), declared in the registry alone ------------------


def test_zero_stage_is_declared_with_deepspeed_and_every_reader_follows() -> None:
    assert [spec.name for spec in REGISTRY if ZERO_STAGE in spec.options] == ["deepspeed"]
    # The model's choices are a copy kept for its migrations: they must not drift.
    assert ZeroStage.choices == list(ZERO_STAGE.choices)
    field = ExperimentForm().fields["zero_stage"]
    assert field.choices == [("", f"default ({ZERO_STAGE.default})"), *ZERO_STAGE.choices]
    assert field.help_text == ZERO_STAGE.help
    assert field.error_messages["invalid_choice"].startswith(ZERO_STAGE.invalid_text())
    assert page_facts_build()["strategies"]["deepspeed"]["options"] == ["zero_stage"]


@pytest.mark.parametrize("spec", REGISTRY, ids=lambda spec: spec.name)
def test_an_option_is_taken_where_declared_and_refused_elsewhere(
    spec: StrategySpec, user_factory: Any, experiment_factory: Any
) -> None:
    for option in OPTIONS_DECLARED:
        value = value_off_default(option)
        argv = ["--strategy", spec.name, *option.cli_args(value)]
        if option in spec.options:
            assert getattr(parse_args(argv), option.name) == value
        else:
            with pytest.raises(SystemExit):
                parse_args(argv)
    experiment = experiment_factory(owner=user_factory(), strategy=spec.name)
    command = training_command(experiment=experiment)
    for option in OPTIONS_DECLARED:
        # A strategy that reads an option is told its default (a switch's off is no words).
        words = option.cli_args(option.default) if option in spec.options else []
        at = command.index(option.flag) if option.flag in command else 0
        assert command[at : at + len(words)] == words
        assert (option.flag in command) == bool(words)
