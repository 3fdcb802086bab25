"""Every strategy option the registry declares (training/registry.py OPTIONS_DECLARED), through
every surface of the dashboard: the launch form, the JSON API and its schema, the read JSON, the
page facts, the clone and the training command agree, for a strategy that reads the option and
one that does not.

The tests are written against the registry, not against today's strategies: each finds a
strategy that reads the option (``option_strategies``) and, where none does yet (the options
other branches attach), attaches it to ddp for the test alone. So they hold before and after the
strategies take their options.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from dashboard.experiments.core.descriptions import (
    experiment_options_label,
    experiment_strategy_label,
)
from dashboard.experiments.core.forms import ExperimentForm, experiment_clone_fields
from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.runner import training_command
from dashboard.experiments.selectors import experiment_as_dict
from dashboard.experiments.templatetags import page_facts
from tests.factories import CPU_STRATEGIES, api_post, form_data, reader_attach, value_off_default
from tests.test_devices import machine_make
from training.registry import (
    COUNT,
    OPTIONS_DECLARED,
    SWITCH,
    StrategyOption,
    option_strategies,
    option_value_text,
)

pytestmark = pytest.mark.django_db

GPU_ONLY = [option for option in OPTIONS_DECLARED if option.gpu_only]


@pytest.fixture(params=OPTIONS_DECLARED, ids=lambda option: option.name)
def option(request: pytest.FixtureRequest) -> StrategyOption:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def pair(option: StrategyOption, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(a strategy that reads `option`, one that does not), both launchable on a CPU box."""
    machine_make(hostname="cpu-box", cpu_count=4)
    reader = reader_attach(option, monkeypatch)
    others = [name for name in CPU_STRATEGIES if name not in option_strategies(option)]
    return reader, others[0]


def form_of(**fields: Any) -> ExperimentForm:
    form = ExperimentForm(form_data(**fields))
    form.is_valid()
    return form


# --- the form -----------------------------------------------------------------------------------


def test_the_form_takes_it_where_read_and_refuses_it_elsewhere(
    option: StrategyOption, pair: tuple[str, str]
) -> None:
    reader, other = pair
    value = value_off_default(option)
    given = form_of(strategy=reader, **{option.name: value})
    assert given.errors == {} and given.cleaned_data[option.name] == value
    # Not given: what the run trains with, the default.
    assert form_of(strategy=reader).cleaned_data[option.name] == option.default
    # Left at its default while the user switched strategies: dropped, not refused.
    left = form_of(strategy=other, **{option.name: option.default})
    assert left.errors == {} and left.cleaned_data[option.name] is None
    refused = form_of(strategy=other, **{option.name: value})
    [message] = refused.errors[option.name]
    assert f"not {other}" in message and reader in message
    assert list(refused.errors) == [option.name]


def test_the_form_field_is_the_registrys(option: StrategyOption) -> None:
    field = ExperimentForm().fields[option.name]
    assert field.help_text == option.help and not field.required
    if option.kind == SWITCH:
        assert field.widget.input_type == "checkbox"
    elif option.kind == COUNT:
        assert (field.min_value, field.max_value) == option.bounds  # type: ignore[attr-defined]
    else:
        assert field.choices == [("", f"default ({option.default})"), *option.choices]  # type: ignore[attr-defined]


@pytest.mark.parametrize("option", GPU_ONLY, ids=lambda option: option.name)
def test_a_gpu_only_value_is_refused_on_the_cpu_with_its_reason(
    option: StrategyOption, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine_make(hostname="cpu-box", cpu_count=4)
    reader = reader_attach(option, monkeypatch)
    for value, reason in option.gpu_only:
        [message] = form_of(strategy=reader, **{option.name: value}).errors[option.name]
        assert reason in message


# --- the API, the read JSON and the command -----------------------------------------------------


def test_the_api_the_read_json_and_the_command_agree(
    option: StrategyOption, pair: tuple[str, str], api: Client, launched: list[int]
) -> None:
    reader, other = pair
    value = value_off_default(option)
    response = api_post(api, {"strategy": reader, option.name: value})
    assert response.status_code == 201, response.content
    assert response.json()[option.name] == value
    experiment = Experiment.objects.get(pk=response.json()["id"])
    assert api.get(f"/api/experiments/{experiment.pk}/").json()[option.name] == value
    command = training_command(experiment=experiment)
    at = command.index(option.flag)
    assert command[at : at + len(option.cli_args(value))] == option.cli_args(value)

    response = api_post(api, {"strategy": other, option.name: option.default})
    assert response.status_code == 201, response.content
    assert response.json()[option.name] is None
    at_default = Experiment.objects.get(pk=response.json()["id"])
    assert option.flag not in training_command(experiment=at_default)

    response = api_post(api, {"strategy": other, option.name: value})
    assert response.status_code == 400, response.content
    assert f"not {other}" in response.json()["errors"][option.name][0]


def bad_type(option: StrategyOption) -> Any:
    """A JSON value of the wrong type: 1 for a switch, "2" for a number, 2 for a string."""
    return {bool: 1, int: "2", str: 2}[type(option.default)]


def test_the_api_refuses_a_bad_type_or_value_naming_the_field(
    option: StrategyOption, pair: tuple[str, str], api: Client, launched: list[int]
) -> None:
    reader, _ = pair
    response = api_post(api, {"strategy": reader, option.name: bad_type(option)})
    assert response.status_code == 400
    assert response.json()["errors"][option.name][0].startswith("must be ")
    if option.kind == SWITCH:
        return  # true and false are all a switch has
    bad = (
        option.bounds[1] + 1
        if option.kind == COUNT
        else {int: 99, str: "warp"}[type(option.default)]
    )
    response = api_post(api, {"strategy": reader, option.name: bad})
    assert response.status_code == 400
    assert option.invalid_text() in response.json()["errors"][option.name][0]
    assert not Experiment.objects.exists() and not launched


def test_the_read_json_gives_the_default_where_a_reader_stored_none(
    option: StrategyOption, pair: tuple[str, str], user_factory: Any, experiment_factory: Any
) -> None:
    reader, other = pair
    owner = user_factory()
    # A row from before the option was declared, or from the admin: null stored.
    assert experiment_as_dict(experiment_factory(owner=owner, strategy=reader))[option.name] == (
        option.default
    )
    assert experiment_as_dict(experiment_factory(owner=owner, strategy=other))[option.name] is None


def test_the_schema_describes_each_option(api: Client) -> None:
    schema = api.get("/api/schema/").json()
    body = schema["paths"]["/api/experiments/"]["post"]["requestBody"]
    launch = body["content"]["application/json"]["schema"]["properties"]
    read = schema["components"]["schemas"]["ExperimentOut"]["properties"]
    for option in OPTIONS_DECLARED:
        assert option.help in launch[option.name]["description"]
        assert option.name in read
        if option.kind == COUNT:
            low, high = option.bounds
            assert (launch[option.name]["minimum"], launch[option.name]["maximum"]) == (low, high)
        elif option.kind != SWITCH:
            assert launch[option.name]["enum"] == [*option.values, None]


# --- the page facts, the form page and the clone ------------------------------------------------


def test_the_page_says_which_strategies_read_it(
    option: StrategyOption, pair: tuple[str, str], api: Client
) -> None:
    reader, other = pair
    strategies = page_facts.page_facts_build()["strategies"]
    assert option.name in strategies[reader]["options"]
    assert option.name not in strategies[other]["options"]
    html = api.get(reverse("experiment-new")).content.decode()
    assert f'id="field-{option.name}"' in html and "default (" in html


def test_launch_again_copies_it(
    option: StrategyOption, pair: tuple[str, str], user_factory: Any, experiment_factory: Any
) -> None:
    reader, _ = pair
    value = value_off_default(option)
    source = experiment_factory(owner=user_factory(), strategy=reader, **{option.name: value})
    assert experiment_clone_fields(source=source)[option.name] == value
    options = experiment_options_label(experiment=source)
    assert options and options in experiment_strategy_label(experiment=source)


# --- where a run is described: its page, the compare page, the list, the admin ------------------


def test_every_page_that_describes_the_run_says_its_options(
    option: StrategyOption, pair: tuple[str, str], user_factory: Any, experiment_factory: Any
) -> None:
    reader, other = pair
    value = value_off_default(option)
    owner = user_factory(staff=True, is_superuser=True)
    client = Client()
    client.force_login(owner)
    run = experiment_factory(owner=owner, name="with it", strategy=reader, **{option.name: value})
    plain = experiment_factory(owner=owner, name="without", strategy=other)
    label = option_value_text(option, value)
    strategy_label = experiment_strategy_label(experiment=run)
    options = experiment_options_label(experiment=run)
    assert strategy_label == f"{run.get_strategy_display()} ({options})"
    assert label in options and experiment_options_label(experiment=plain) == ""
    # The run page: a fact per option its strategy reads, none for the others.
    page = client.get(run.get_absolute_url()).content.decode()
    assert f'data-option="{option.name}"' in page
    assert (
        f'data-option="{option.name}"' not in client.get(plain.get_absolute_url()).content.decode()
    )
    compare = client.get(reverse("experiment-compare") + f"?ids={run.pk},{plain.pk}").content
    # The compare table names the strategy short, its options in words, the whole label its
    # tooltip (the table fits 1280 px: issue 34).
    cell = f'<td data-field="strategy"><abbr title="{escape(strategy_label)}">'
    assert cell in compare.decode() and f"({escape(options)})</span></td>" in compare.decode()
    assert (
        f'title="{escape(strategy_label)}"'
        in client.get(reverse("experiment-list")).content.decode()
    )
    admin = client.get(f"/admin/experiments/experiment/?{option.name}={value}").content.decode()
    assert "with it" in admin and "without" not in admin and escape(options) in admin
