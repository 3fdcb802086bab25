"""HTML pages for experiments: the list, the launch form and the live detail page.

The pages render their initial state on the server; the scripts in static/js keep them live
(the list polls the JSON API, the detail page listens on the experiment's WebSocket).
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotFound
from django.shortcuts import get_object_or_404, redirect, render

from dashboard.experiments.checkpoints import (
    checkpoint_file_resolve,
    checkpoint_file_response,
    checkpoint_where_text,
)
from dashboard.experiments.forms import FIELDS, ExperimentForm
from dashboard.experiments.limits import LaunchLimited
from dashboard.experiments.models import PROCESS_STRATEGIES, Experiment, Status, Strategy
from dashboard.experiments.scaling import (
    BASELINE_RULE,
    NO_BASELINE,
    WORLD_SIZE_RULE,
    baseline_batch_note,
    compare_ids_parse,
    comparison_build,
    scaling_rows_build,
)
from dashboard.experiments.services import (
    experiment_can_control,
    experiment_launch,
    experiment_snapshot_build,
    experiments_visible_to,
)
from dashboard.texts import format_duration, words_joined
from training.registry import REGISTRY, STRATEGIES

# The detail page embeds the stored curve so that it draws before the socket opens; the log box
# shows only the tail.
DETAIL_LOG_LINES = 200
# The list shows as many runs as one page of the JSON API that keeps it live.
LIST_LIMIT = 500
# What a launch post carries besides the form's own fields.
FORM_POST_EXTRA_KEYS = frozenset({"csrfmiddlewaretoken", "clone"})


def strategy_short(name: str) -> str:
    """The name in the list's narrow column (the full one is its tooltip)."""
    spec = STRATEGIES.get(name)
    return spec.short if spec else name


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
        "strategy_short": strategy_short(experiment.strategy),
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


def form_unknown_keys(*, data: Any, form: ExperimentForm) -> str:
    """Names a launch post carries that the form does not read: refused, not dropped."""
    unknown = sorted(set(data) - set(form.fields) - FORM_POST_EXTRA_KEYS)
    # Names come from the client: show a few, shortened.
    return ", ".join(name[:40] for name in unknown[:5]) + (", ..." if len(unknown) > 5 else "")


def _form_help() -> dict[str, str]:
    """Help lines that name the strategies with processes ("DDP, Hogwild and DeepSpeed")."""
    names = words_joined([STRATEGIES[name].short for name in PROCESS_STRATEGIES])
    return {
        "processes_help": f"Processes of {names} (the others run one); leave empty for one per "
        "GPU, or 2 on the CPU.",
        "batch_size_help": f"Per process: {names} processes each take a batch this size; "
        "DataParallel splits it across its GPUs.",
    }


def experiment_new(request: HttpRequest) -> HttpResponse:
    source: Experiment | None = None
    clone_id = request.POST.get("clone") if request.method == "POST" else request.GET.get("clone")
    if clone_id:
        source = _visible_or_404(request, clone_id)

    retry_after: int | None = None
    if request.method == "POST":
        form = ExperimentForm(request.POST)
        unknown = form_unknown_keys(data=request.POST, form=form)
        if unknown:
            form.add_error(None, f"unknown fields: {unknown}; the fields are {', '.join(FIELDS)}")
        if form.is_valid():
            try:
                experiment = experiment_launch(owner=request.user, fields=form.cleaned_data)
            except LaunchLimited as refused:
                form.add_error(None, refused.message)
                retry_after = refused.retry_after
            else:
                if source is not None:
                    Experiment.objects.filter(pk=experiment.pk).update(cloned_from=source)
                return redirect(experiment)
        status = 400 if retry_after is None else 429
    else:
        form = ExperimentForm(initial=_clone_initial(source) if source else None)
        status = 200

    context = {
        "form": form,
        "source": source,
        "strategy_help": REGISTRY,
        "process_strategies": " ".join(str(value) for value in PROCESS_STRATEGIES),
        **_form_help(),
        "deepspeed_value": str(Strategy.DEEPSPEED),
    }
    response = render(request, "experiments/form.html", context, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _visible_or_404(request, pk)
    initial = experiment_snapshot_build(experiment=experiment, log_lines=DETAIL_LOG_LINES)
    [scaling] = scaling_rows_build(
        experiments=[experiment], visible=experiments_visible_to(request.user)
    )
    initial["scaling"] = scaling.as_dict()
    context = {
        "experiment": experiment,
        "initial": initial,
        "logs": initial["logs"],
        # The snapshot's texts (run_facts.py), which the page's script places the same way.
        "facts": {**initial["run"], **initial["texts"]},
        "rank_rows": initial["texts"]["ranks"],
        "checkpoints": initial["texts"]["checkpoints"],
        "scaling": scaling,
        "scaling_note": baseline_batch_note(scaling),
        "baseline_rule": BASELINE_RULE,
        "no_baseline": NO_BASELINE,
        "can_control": experiment_can_control(experiment=experiment, user=request.user),
        "progress": progress_percent(experiment),
        "accuracy": format_percent(experiment.test_accuracy),
        "duration": format_duration(experiment.duration_seconds),
        "run_info": experiment.run_info or {},
        "final": not experiment.is_active,
    }
    return render(request, "experiments/detail.html", context)


def experiment_checkpoint_download(request: HttpRequest, pk: int, step: int) -> HttpResponse:
    """The checkpoint file at one step: owner or staff, and only from inside the runs folder."""
    experiment = _visible_or_404(request, pk)
    if not experiment_can_control(experiment=experiment, user=request.user):
        raise Http404("No such checkpoint")
    checkpoint = get_object_or_404(experiment.checkpoints, step=step)
    path = checkpoint_file_resolve(checkpoint=checkpoint)
    if path is None:
        # Plain text: the reason is the useful part, and the default 404 page drops it.
        return HttpResponseNotFound(
            checkpoint_where_text(checkpoint=checkpoint, experiment=experiment),
            content_type="text/plain; charset=utf-8",
        )
    return checkpoint_file_response(checkpoint=checkpoint, path=path)


def experiment_compare(request: HttpRequest) -> HttpResponse:
    try:
        ids = compare_ids_parse(request.GET.getlist("ids"))
    except ValueError as exc:
        return render(
            request, "experiments/compare.html", {"error": str(exc), "rows": []}, status=400
        )
    context = {
        **comparison_build(user=request.user, ids=ids),
        "ids": ids,
        "baseline_rule": BASELINE_RULE,
        "no_baseline": NO_BASELINE,
        "world_size_rule": WORLD_SIZE_RULE,
    }
    return render(request, "experiments/compare.html", context)
