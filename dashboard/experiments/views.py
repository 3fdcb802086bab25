"""HTML pages for experiments: the list, the launch form and the live detail page.

The pages render their initial state on the server; the scripts in static/js keep them live
(the list polls the JSON API, the detail page listens on the experiment's WebSocket).
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from dashboard.experiments.forms import FIELDS, STRATEGY_HELP, ExperimentForm
from dashboard.experiments.models import Experiment, Status, Strategy
from dashboard.experiments.services import (
    experiment_as_dict,
    experiment_can_control,
    experiment_launch,
    experiments_visible_to,
)

# The detail page embeds the stored curve so that it draws before the socket opens; the log box
# shows only the tail.
DETAIL_LOG_LINES = 200
# The list shows as many runs as one page of the JSON API that keeps it live.
LIST_LIMIT = 500
# The list's strategy column is narrow: short names, the full one as a tooltip.
STRATEGY_SHORT = {Strategy.SINGLE: "Single", Strategy.DP: "DP", Strategy.DDP: "DDP"}


def format_duration(seconds: float | None) -> str:
    """12s, 3m 05s, 1h 02m: the same text as formatDuration() in the page scripts."""
    if seconds is None:
        return "—"
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def format_percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction * 100:.2f}%"


def progress_percent(experiment: Experiment) -> float:
    if experiment.status == Status.SUCCEEDED:
        return 100.0
    if not experiment.total_steps:
        return 0.0
    return round(min(100.0, 100.0 * experiment.step / experiment.total_steps), 1)


def _row(experiment: Experiment) -> dict[str, Any]:
    return {
        "experiment": experiment,
        "strategy_short": STRATEGY_SHORT.get(experiment.strategy, experiment.strategy),
        "progress": progress_percent(experiment),
        "accuracy": format_percent(experiment.test_accuracy),
        "duration": format_duration(experiment.duration_seconds),
    }


def experiment_list(request: HttpRequest) -> HttpResponse:
    experiments = list(experiments_visible_to(request.user)[: LIST_LIMIT + 1])
    context = {
        "rows": [_row(e) for e in experiments[:LIST_LIMIT]],
        "truncated": len(experiments) > LIST_LIMIT,
        "limit": LIST_LIMIT,
        "strategy_labels": {
            value: {"short": STRATEGY_SHORT.get(value, value), "label": label}
            for value, label in Strategy.choices
        },
        "show_owner": request.user.is_staff,
    }
    return render(request, "experiments/list.html", context)


def _visible_or_404(request: HttpRequest, pk: Any) -> Experiment:
    try:
        pk = int(pk)
    except (TypeError, ValueError):
        raise Http404("No such experiment") from None
    return get_object_or_404(experiments_visible_to(request.user), pk=pk)


def _clone_initial(source: Experiment) -> dict[str, Any]:
    initial = {name: getattr(source, name) for name in FIELDS}
    initial["name"] = f"{source.name} (again)"[:200]
    return initial


def experiment_new(request: HttpRequest) -> HttpResponse:
    source: Experiment | None = None
    clone_id = request.POST.get("clone") if request.method == "POST" else request.GET.get("clone")
    if clone_id:
        source = _visible_or_404(request, clone_id)

    if request.method == "POST":
        form = ExperimentForm(request.POST)
        if form.is_valid():
            experiment = experiment_launch(owner=request.user, fields=form.cleaned_data)
            if source is not None:
                Experiment.objects.filter(pk=experiment.pk).update(cloned_from=source)
            return redirect(experiment)
        status = 400
    else:
        form = ExperimentForm(initial=_clone_initial(source) if source else None)
        status = 200

    context = {
        "form": form,
        "source": source,
        "strategy_help": [
            {"value": value, "label": label, "help": STRATEGY_HELP.get(value, "")}
            for value, label in Strategy.choices
        ],
        "ddp_value": str(Strategy.DDP),
    }
    return render(request, "experiments/form.html", context, status=status)


def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _visible_or_404(request, pk)
    logs = list(experiment.logs.order_by("-seq", "-id")[:DETAIL_LOG_LINES])
    logs.reverse()
    initial = {
        "type": "snapshot",
        "seq": experiment.last_seq,
        "experiment": experiment_as_dict(experiment),
        "points": [point.as_dict() for point in experiment.points.all()],
        "logs": [line.as_dict() for line in logs],
    }
    context = {
        "experiment": experiment,
        "initial": initial,
        "logs": logs,
        "can_control": experiment_can_control(experiment=experiment, user=request.user),
        "progress": progress_percent(experiment),
        "accuracy": format_percent(experiment.test_accuracy),
        "duration": format_duration(experiment.duration_seconds),
        "run_info": experiment.run_info or {},
        "final": not experiment.is_active,
    }
    return render(request, "experiments/detail.html", context)
