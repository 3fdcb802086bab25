"""HTML pages for experiments: the list, the launch form and the live detail page.

The pages render their initial state on the server; the scripts in static/js keep them live
(the list polls the JSON API, the detail page listens on the experiment's WebSocket).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

from django.db.models import QuerySet
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotFound,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from dashboard.experiments.core.access import (
    experiment_can_control,
    experiments_visible_to,
    reason_for_owner,
    script_allowed,
)
from dashboard.experiments.core.catalogue_checks import stage_limits_known
from dashboard.experiments.core.catalogue_options import launch_options
from dashboard.experiments.core.checkpoints import (
    checkpoint_file_resolve,
    checkpoint_file_response,
    checkpoint_where_text,
)
from dashboard.experiments.core.descriptions import (
    experiment_dataset_label,
    experiment_devices_label,
    experiment_duration_seconds,
    experiment_is_active,
    experiment_language_facts,
    experiment_option_facts,
    experiment_options_label,
    experiment_script_facts,
    experiment_strategy_label,
)
from dashboard.experiments.core.form_texts import form_help
from dashboard.experiments.core.forms import (
    ENGINE_ONLY_DEFAULTS,
    FIELDS,
    FORM_STRATEGIES,
    SCRIPT_STRATEGIES,
    ExperimentForm,
    experiment_clone_fields,
    launch_form_strategies,
)
from dashboard.experiments.core.limits import LaunchLimited
from dashboard.experiments.core.memory import MEMORY_RULE
from dashboard.experiments.core.messages import socket_path
from dashboard.experiments.core.stalls import stalled_rows
from dashboard.experiments.metrics.language import language_page_texts
from dashboard.experiments.metrics.phases import SHARES_RULE
from dashboard.experiments.metrics.scaling import (
    BASELINE_RULE,
    NO_BASELINE,
    WORLD_SIZE_RULE,
    ScalingRow,
    baseline_batch_note,
    compare_ids_parse,
    comparison_build,
    scaling_chart_build,
    scaling_rows_build,
)
from dashboard.experiments.metrics.throughput import THROUGHPUT_RULE, THROUGHPUT_TITLE
from dashboard.experiments.models import (
    PROCESS_STRATEGIES,
    CodeArchive,
    Dataset,
    Experiment,
    Status,
    Strategy,
)
from dashboard.experiments.scripts.code import (
    CodeRefused,
    code_archive_open,
    code_bounds,
    code_download_name,
    code_max_bytes,
)
from dashboard.experiments.scripts.form import ScriptForm, script_folders
from dashboard.experiments.selectors import experiment_snapshot_build, slurm_launch_facts
from dashboard.experiments.services import experiment_launch, experiment_launch_refusals
from dashboard.experiments.web.run_list import (
    SORT_FIELDS,
    ListQuery,
    ListQueryError,
    list_query_params,
    list_query_parse,
    runs_page,
)
from dashboard.texts import end_confirm, format_duration, words_joined
from training.registry import REGISTRY, SHARED_BATCH_STRATEGIES, STRATEGIES

# The detail page embeds the stored curve so that it draws before the socket opens; the log box
# shows only the tail.
DETAIL_LOG_LINES = 200
# Rows of the list page's first page; "More runs" loads the next ones (keyset, run_list.py).
LIST_LIMIT = 50
# An uploaded archive's kind (scripts/code.py's MAGIC), as its download says it.
CODE_CONTENT_TYPES = {"tar.gz": "application/gzip", "zip": "application/zip"}
# What a launch post carries besides the form's own fields.
FORM_POST_EXTRA_KEYS = frozenset({"csrfmiddlewaretoken", "clone"})
# The strategies with processes that the launch form offers (its help names them).
FORM_PROCESS_STRATEGIES = tuple(name for name in PROCESS_STRATEGIES if name in FORM_STRATEGIES)


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
        # The short name's tooltip, and the model's: the same texts as the JSON's.
        "strategy_label": experiment_strategy_label(experiment=experiment),
        "dataset_label": experiment_dataset_label(experiment=experiment),
        "devices_label": experiment_devices_label(experiment=experiment),
        "progress": progress_percent(experiment),
        "accuracy": format_percent(experiment.test_accuracy),
        "duration": format_duration(experiment_duration_seconds(experiment=experiment)),
    }


def _filter_params(query: ListQuery) -> dict[str, str]:
    """The page's filters and sort as GET parameters (the page size is the page's own)."""
    params = list_query_params(query)
    params.pop("limit", None)
    return params


def _sort_links(query: ListQuery) -> dict[str, dict[str, str]]:
    """Per sortable column: the link that sorts by it (again: the other way) and its state."""
    links = {}
    for name in SORT_FIELDS:
        current = query.sort.lstrip("-") == name
        # Names read A to Z first; dates, accuracy and durations biggest first.
        first = name if name in {"name", "status"} else f"-{name}"
        sort = (name if query.descending else f"-{name}") if current else first
        params = {**_filter_params(query), "sort": sort}
        state = ("descending" if query.descending else "ascending") if current else "none"
        links[name] = {"url": "?" + urlencode(params), "aria": state}
    return links


def experiment_list(request: HttpRequest) -> HttpResponse:
    """One page of runs (the list's filters and sort in the query string, as the JSON API
    takes them); the page's script loads the next ones and keeps these live."""
    error = ""
    try:
        query = replace(list_query_parse(request.GET), limit=LIST_LIMIT)
    except ListQueryError as exc:
        query, error = ListQuery(limit=LIST_LIMIT), str(exc)
    visible = experiments_visible_to(request.user)
    page = runs_page(visible=visible, query=query)
    params = _filter_params(query)
    following = {**list_query_params(query), "page": page.next}
    context = {
        "rows": [_row(e) for e in page.rows],
        "count": page.count,
        "next_url": page.next and f"{reverse('api-experiments')}?{urlencode(following)}",
        "poll_query": urlencode(params),
        "query": query,
        "filtered": any(name != "sort" for name in params) and not error,
        "error": error,
        "sorts": _sort_links(query),
        "statuses": Status.choices,
        "strategies": Strategy.choices,
        "datasets": _dataset_filter_choices(visible=visible),
        "show_owner": request.user.is_staff,
    }
    return render(request, "experiments/list.html", context)


def _dataset_filter_choices(*, visible: QuerySet[Experiment]) -> list[tuple[str, str]]:
    """The built-ins, then every other dataset a run the user may see has used (imagefolder,
    plug-ins): another user's plug-in's name is theirs."""
    used = visible.exclude(dataset__in=Dataset.values).values_list("dataset", flat=True)
    return [*Dataset.choices, *((name, name) for name in sorted(set(used)))]


def _visible_or_404(request: HttpRequest, pk: Any) -> Experiment:
    try:
        pk = int(pk)
    except (TypeError, ValueError):
        raise Http404("No such experiment") from None
    return get_object_or_404(experiments_visible_to(request.user), pk=pk)


def form_unknown_keys(*, data: Any, form: ExperimentForm, script: ScriptForm | None = None) -> str:
    """Names a launch post carries that the forms do not read: refused, not dropped."""
    known = set(form.fields) | set(script.fields if script is not None else ())
    unknown = sorted(set(data) - known - FORM_POST_EXTRA_KEYS)
    # Names come from the client: show a few, shortened.
    return ", ".join(name[:40] for name in unknown[:5]) + (", ..." if len(unknown) > 5 else "")


def _form_help() -> dict[str, str]:
    """Help lines that name the strategies with processes ("DDP, Hogwild and DeepSpeed")."""
    names = words_joined([STRATEGIES[name].short for name in FORM_PROCESS_STRATEGIES])
    shared = words_joined([STRATEGIES[name].short for name in SHARED_BATCH_STRATEGIES])
    return {
        "processes_help": f"Processes of {names} (the others run one); leave empty for one per "
        "GPU, or 2 on the CPU.",
        "batch_size_help": f"Per process: {names} processes each take a batch this size; "
        f"the ranks of a tensor-parallel group or a pipeline ({shared}) share one; DataParallel "
        "splits it across its GPUs.",
    }


def _launch_forms(
    request: HttpRequest, source: Experiment | None, strategies: tuple[str, ...]
) -> tuple[ExperimentForm, ScriptForm]:
    """The page's two forms: the engine's fields and a script's, bound to a post, or filled
    from the run copied."""
    if request.method == "POST":
        data = request.POST.copy()
        if data.get("strategy") in SCRIPT_STRATEGIES:
            # The page hides the engine's fields for a script, which reads none of them: what
            # they hold was left from another strategy, and the run stores their defaults.
            for name, default in ENGINE_ONLY_DEFAULTS.items():
                data[name] = "" if default is None else str(default)
        return ExperimentForm(data, strategies=strategies), ScriptForm(request.POST)
    initial = experiment_clone_fields(source=source) if source else None
    script_initial = ScriptForm.initial_of(initial) if initial else None
    form = ExperimentForm(initial=initial, strategies=strategies)
    return form, ScriptForm(initial=script_initial)


def _launch_fields(
    request: HttpRequest, form: ExperimentForm, script: ScriptForm
) -> dict[str, Any] | None:
    """The run's fields once both forms are valid, else None with the reasons on them; the
    script's fields are read only for a script run (the others drop them, as their options)."""
    form_valid, script_valid = form.is_valid(), script.is_valid()
    strategy = form.cleaned_data.get("strategy") if hasattr(form, "cleaned_data") else None
    runs_script = strategy in SCRIPT_STRATEGIES
    if not form_valid or (runs_script and not script_valid):
        return None
    if not runs_script:
        return dict(form.cleaned_data)
    script_fields = script.launch_fields(owner=request.user, name=request.POST.get("name", ""))
    return None if script_fields is None else {**form.cleaned_data, **script_fields}


def experiment_new(request: HttpRequest) -> HttpResponse:
    source: Experiment | None = None
    clone_id = request.POST.get("clone") if request.method == "POST" else request.GET.get("clone")
    if clone_id:
        source = _visible_or_404(request, clone_id)

    strategies = launch_form_strategies(user=request.user)
    form, script = _launch_forms(request, source, strategies)
    retry_after: int | None = None
    status = 200
    if request.method == "POST":
        unknown = form_unknown_keys(data=request.POST, form=form, script=script)
        if unknown:
            form.add_error(None, f"unknown fields: {unknown}; the fields are {', '.join(FIELDS)}")
        fields = _launch_fields(request, form, script)
        if fields is not None and not unknown:
            # A Slurm run no partition can hold, said on its field (the API's 400 says the same).
            for field, messages in experiment_launch_refusals(fields=fields).items():
                for message in messages:
                    form.add_error(field if field in form.fields else None, message)
        if fields is not None and not unknown and form.is_valid():
            try:
                experiment = experiment_launch(
                    owner=request.user, fields=fields, cloned_from=source
                )
            except LaunchLimited as refused:
                form.add_error(None, refused.message)
                retry_after = refused.retry_after
            else:
                return redirect(experiment)
        status = 400 if retry_after is None else 429

    # What the online workers have: the selects' options, and their explanations for the script.
    options = launch_options()
    form.options_apply(options)
    slurm = slurm_launch_facts()  # None where Slurm is not configured: no backend to choose
    if slurm is not None:
        form.partitions_apply(slurm["partitions"])
    context = {
        "form": form,
        "script_form": script,
        "offers_script": bool(set(strategies) & set(SCRIPT_STRATEGIES)),
        "script_folders": script_folders(),
        "code_upload": _code_upload_facts(
            user=request.user,
            code=script.data.get("code") if script.is_bound else script.initial.get("code"),
        ),
        "source": source,
        "launch_options": options,
        "slurm": slurm,
        # Each strategy's help and each model's stage limit, which the page's script shows.
        "form_help": form_help(stage_limits=stage_limits_known()),
        "strategy_help": [spec for spec in REGISTRY if spec.name in strategies],
        "process_strategies": " ".join(name for name in PROCESS_STRATEGIES if name in strategies),
        **_form_help(),
    }
    response = render(request, "experiments/form.html", context, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _code_upload_facts(*, user: Any, code: Any) -> dict[str, Any]:
    """What the page's upload needs: the route, the bounds, and the code already uploaded (the
    run copied, or the one a refused post carried), shown as such so that it is not sent again."""
    archive = None
    if isinstance(code, int) or (isinstance(code, str) and code.isdigit()):
        archive = CodeArchive.objects.filter(pk=int(code), owner_id=user.pk).first()
    bounds = code_bounds()
    return {
        "url": reverse("api-code"),
        "max_bytes": code_max_bytes(),
        "max_unpacked_bytes": bounds.unpacked_bytes,
        "max_files": bounds.members,
        "current": None
        if archive is None
        else {"sha256": archive.sha256, "files": archive.files, "bytes": archive.bytes},
    }


def _can_run_again(experiment: Experiment, user: Any) -> bool:
    if experiment.imported or experiment.reported:
        return False
    return experiment.strategy not in SCRIPT_STRATEGIES or script_allowed(user=user)


def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _visible_or_404(request, pk)
    initial = experiment_snapshot_build(experiment=experiment, log_lines=DETAIL_LOG_LINES)
    [scaling] = scaling_rows_build(
        experiments=[experiment], visible=experiments_visible_to(request.user)
    )
    initial["scaling"] = scaling.as_dict()
    active = experiment_is_active(experiment=experiment)
    can_control = experiment_can_control(experiment=experiment, user=request.user)
    context = {
        "experiment": experiment,
        # Other users' runs it waits behind are not named to its owner (the queue page's rule).
        "waiting_reason": reason_for_owner(experiment=experiment, reason=experiment.waiting_reason),
        # Its settings in words (core/descriptions.py): the heading's and the Settings card's.
        "devices_label": experiment_devices_label(experiment=experiment),
        "dataset_label": experiment_dataset_label(experiment=experiment),
        "option_facts": experiment_option_facts(experiment=experiment),
        # A language model's size, window and sequence parallel (empty for the other models).
        "language_facts": experiment_language_facts(experiment=experiment),
        # Its tokens/s, MFU, bits per byte and latest text with their texts (the snapshot's,
        # which static/js/language.js keeps live), None for the other models.
        "language": initial["language"],
        "language_texts": language_page_texts(),
        # A script run's entry point, arguments and code, in place of the engine's settings
        # (empty for the other strategies).
        "script_facts": experiment_script_facts(experiment=experiment),
        # "Run again" fills the launch form with its settings: not for a run trained elsewhere
        # (imported, or reported by a script there), nor a script for one who may not run one.
        "can_run_again": _can_run_again(experiment, request.user),
        "code_download": bool(experiment.code_id) and can_control,
        "initial": initial,
        "ws_path": socket_path(experiment.pk),
        "logs": initial["logs"],
        # The snapshot's texts (run_facts.py), which the page's script places the same way.
        "facts": {**initial["run"], **initial["texts"]},
        "rank_rows": initial["texts"]["ranks"],
        "memory_rows": initial["texts"]["memory"],
        "memory_rule": MEMORY_RULE,
        # The stalled banner's ranks: each one's line and stack (core/stalls.py), none while it
        # steps; the same lines as the snapshot's texts.stalled, which stalled.js places.
        "stalled_rows": stalled_rows(experiment.stalled),
        "checkpoints": initial["texts"]["checkpoints"],
        "scaling": scaling,
        "scaling_note": baseline_batch_note(scaling),
        "baseline_rule": BASELINE_RULE,
        "no_baseline": NO_BASELINE,
        # The headline's, the Scaling card's and the Ranks table's images/s: one definition.
        "throughput_title": THROUGHPUT_TITLE,
        "throughput_rule": THROUGHPUT_RULE,
        "can_control": can_control,
        # Stop asks first where the run was launched long ago (texts.end_confirm).
        "stop_confirm": end_confirm(
            name=experiment.name, launched_at=experiment.created_at.timestamp()
        ),
        "progress": progress_percent(experiment),
        "accuracy": format_percent(experiment.test_accuracy),
        "duration": format_duration(experiment_duration_seconds(experiment=experiment)),
        "run_info": experiment.run_info or {},
        # Queued or running: it can still be stopped, profiled or checkpointed.
        "active": active,
        "final": not active,
    }
    return render(request, "experiments/detail.html", context)


def _not_here(reason: str) -> HttpResponse:
    """A 404 in plain text: the reason is the useful part, and the default 404 page drops it."""
    return HttpResponseNotFound(reason, content_type="text/plain; charset=utf-8")


def experiment_checkpoint_download(request: HttpRequest, pk: int, step: int) -> HttpResponse:
    """The checkpoint file at one step: owner or staff, and only from inside the runs folder."""
    experiment = _visible_or_404(request, pk)
    if not experiment_can_control(experiment=experiment, user=request.user):
        raise Http404("No such checkpoint")
    checkpoint = get_object_or_404(experiment.checkpoints, step=step)
    path = checkpoint_file_resolve(checkpoint=checkpoint)
    if path is None:
        return _not_here(checkpoint_where_text(checkpoint=checkpoint, experiment=experiment))
    return checkpoint_file_response(checkpoint=checkpoint, path=path)


def experiment_code_download(request: HttpRequest, pk: int) -> HttpResponse:
    """A script run's upload, the archive's bytes as stored (.tar.gz or .zip): owner or staff, as
    its checkpoints are; a 404 for everyone else, so that it says nothing of the run."""
    experiment = _visible_or_404(request, pk)
    if not experiment_can_control(experiment=experiment, user=request.user):
        raise Http404("No such code")
    code = experiment.code
    if code is None:
        folder = experiment.code_path
        ran = f": it ran the folder {folder} on its workers" if folder else ""
        return _not_here(f"Run {experiment.pk} has no uploaded code to download{ran}.")
    try:
        archive = code_archive_open(code=code)
    except CodeRefused as missing:
        return _not_here(str(missing))
    return FileResponse(
        archive,
        as_attachment=True,
        filename=code_download_name(experiment=experiment, code=code),
        content_type=CODE_CONTENT_TYPES[code.kind],
    )


def chart_run(experiment: Experiment, *, label: str, global_batch: int) -> dict[str, Any]:
    """One run of the overlaid curves (the compare and study pages, static/js/compare.js):
    where its series and live events come from, and what turns its steps into images seen and
    wall time."""
    e = experiment
    return {
        "id": e.pk,
        "label": label,
        "status": e.status,
        "active": experiment_is_active(experiment=e),
        "metrics_url": reverse("api-experiment-metrics", args=[e.pk]),
        "ws_path": socket_path(e.pk),
        "global_batch": global_batch,
        "started_at": e.started_at.isoformat() if e.started_at else None,
    }


def _compare_run(row: ScalingRow) -> dict[str, Any]:
    e = row.experiment
    label = f"#{e.pk} {strategy_short(e.strategy)} {e.name}"
    return chart_run(e, label=label, global_batch=row.global_batch)


def _compare_line(row: ScalingRow) -> dict[str, Any]:
    return {
        "row": row,
        # The short name in the narrow column, its options in words; the whole label its tooltip.
        "strategy_short": strategy_short(row.experiment.strategy),
        "options_label": experiment_options_label(experiment=row.experiment),
        "strategy_label": experiment_strategy_label(experiment=row.experiment),
        "dataset_label": experiment_dataset_label(experiment=row.experiment),
    }


def experiment_compare(request: HttpRequest) -> HttpResponse:
    try:
        ids = compare_ids_parse(request.GET.getlist("ids"))
    except ValueError as exc:
        return render(
            request, "experiments/compare.html", {"error": str(exc), "rows": []}, status=400
        )
    comparison = comparison_build(user=request.user, ids=ids)
    context = {
        **comparison,
        # The table: each row with its strategy and dataset in words (core/descriptions.py).
        "table": [_compare_line(row) for row in comparison["rows"]],
        "charts": {
            "runs": [_compare_run(row) for row in comparison["rows"]],
            "scaling": scaling_chart_build(comparison["rows"]),
        },
        "ids": ids,
        "baseline_rule": BASELINE_RULE,
        "no_baseline": NO_BASELINE,
        "world_size_rule": WORLD_SIZE_RULE,
        "memory_rule": MEMORY_RULE,
        "shares_rule": SHARES_RULE,
        # Tokens/s, MFU and bits per byte, where a language model's run is compared.
        "language_columns": any(row.language for row in comparison["rows"]),
        "language_texts": language_page_texts(),
    }
    return render(request, "experiments/compare.html", context)
