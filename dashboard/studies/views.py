"""The study pages: the form (/studies/new/), the list and the live study page. They render
from services.py; static/js/study.js keeps the study page live (the API, and compare.js for the
curves)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard.experiments.core.catalogue_options import launch_options
from dashboard.experiments.core.limits import LaunchLimited
from dashboard.experiments.core.memory import MEMORY_RULE
from dashboard.experiments.metrics.language import language_page_texts
from dashboard.experiments.metrics.phases import SHARES_RULE
from dashboard.experiments.metrics.scaling import experiment_global_batch
from dashboard.experiments.web.views import chart_run
from dashboard.studies.forms import StudyForm
from dashboard.studies.grid import StudyRefused, study_request_parse
from dashboard.studies.models import Study
from dashboard.studies.services import (
    studies_list,
    studies_visible_to,
    study_as_dict,
    study_can_control,
    study_create,
    study_runs,
    study_stop,
)
from dashboard.studies.texts import (
    ACCURACY_RULE,
    MEMORY_CELL_RULE,
    SKIPPED_RULE,
    SPEEDUP_RULE,
    TIME_TO_TARGET_RULE,
)
from training.registry import strategy_get


def study_list(request: HttpRequest) -> HttpResponse:
    return render(request, "studies/list.html", {"studies": studies_list(user=request.user)})


def study_new(request: HttpRequest) -> HttpResponse:
    form = StudyForm(request.POST or None)
    refused: StudyRefused | None = None
    if request.method == "POST" and form.is_valid():
        try:
            study = study_create(owner=request.user, request=study_request_parse(form.payload()))
        except StudyRefused as exc:
            refused = exc
        except LaunchLimited as exc:
            form.add_error(None, exc.message)
        else:
            return redirect(study.get_absolute_url())
    status = 400 if request.method == "POST" else 200
    form.options_apply(launch_options())
    return render(request, "studies/form.html", {"form": form, "refused": refused}, status=status)


def _visible(request: HttpRequest, pk: int) -> Study:
    study = studies_visible_to(request.user).filter(pk=pk).first()
    if study is None:
        raise Http404("no such study")
    return study


def _chart_run(experiment: Any) -> dict[str, Any]:
    e = experiment
    label = f"#{e.pk} {strategy_get(e.strategy).short} seed {e.seed}"
    return chart_run(e, label=label, global_batch=experiment_global_batch(e))


def study_detail(request: HttpRequest, pk: int) -> HttpResponse:
    study = _visible(request, pk)
    data = study_as_dict(study)
    language = any(cell["language"] for cell in data["cells"])
    texts = language_page_texts()
    context = {
        "study": study,
        "data": data,
        # Tokens/s, MFU and bits per byte, where a cell trains a language model.
        "language_columns": language,
        "language_texts": texts,
        "can_control": study_can_control(study=study, user=request.user),
        "charts": {
            "runs": [_chart_run(e) for e in study_runs(study)],
            "scaling": data["scaling"]["chart"],
        },
        "rules": [
            TIME_TO_TARGET_RULE,
            ACCURACY_RULE,
            SPEEDUP_RULE,
            f"{MEMORY_CELL_RULE} {MEMORY_RULE}",
            SHARES_RULE,
            *((texts["tokens_rule"], texts["mfu_rule"], texts["bpb_rule"]) if language else ()),
        ],  # fmt: skip
        "skipped_rule": SKIPPED_RULE,
        "live": {"api_url": reverse("api-study", args=[study.pk])},
    }
    return render(request, "studies/detail.html", context)


@require_POST
def study_stop_page(request: HttpRequest, pk: int) -> HttpResponse:
    study = _visible(request, pk)
    if study_can_control(study=study, user=request.user):
        study_stop(study=study, by=request.user)
    return redirect(study.get_absolute_url())
