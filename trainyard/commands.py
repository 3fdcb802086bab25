"""What each `trainyard` subcommand does; cli.py reads the command line and calls one.

Exit codes a script can rely on: 0 when the run succeeded (or the command did what it was asked),
1 the run failed, 2 bad input (the server's validation messages on stderr), 3 the run was
cancelled, 5 the server refused or could not be reached, 130 interrupted. (No code for `lost`:
a lost run is never where a watch ends; it resumes, or fails.)
"""

from __future__ import annotations

import argparse
import csv
import getpass
import json
import sys
from typing import Any

from trainyard.api import Api, token_create
from trainyard.config import config_save, profile_resolve, url_normalize
from trainyard.watch import run_follow

# 4 was `lost`, which never ends a run: left unused so that 5 keeps its meaning for scripts.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED, EXIT_ERROR = 0, 1, 2, 3, 5
EXIT_INTERRUPTED = 130
EXIT_BY_STATUS = {
    "succeeded": EXIT_OK,
    "failed": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
}
METRIC_COLUMNS = (
    "step",
    "epoch",
    "train_loss",
    "test_loss",
    "test_accuracy",
    "images_per_second",
    "time",
)
# The strategy options, with the engine's flag names (training/registry.py OPTIONS_DECLARED,
# which this client never imports: tests/test_client.py checks that they agree): the flag, its
# value's type (None: a switch, sent as true when given) and its values for --help. The server
# refuses an option the run's strategy does not read, and a value that needs GPUs on the CPU.
OPTION_FLAGS: tuple[tuple[str, type | None, str], ...] = (
    ("--zero-stage", int, "DeepSpeed's ZeRO stage: 1 or 2"),
    ("--comm-hook", str, "DDP's communication hook: none, fp16, powersgd, bf16 (GPUs)"),
    ("--shard-optimizer", None, "DDP with ZeroRedundancyOptimizer (PyTorch's ZeRO-1)"),
    ("--accumulate", int, "gradient accumulation steps: batches an optimizer step, 1 to 1024"),
    ("--compile", None, "torch.compile the model first"),
    ("--precision", str, "fp32, bf16 or fp16 (GPUs)"),
    ("--pipeline-schedule", str, "pipeline schedule: gpipe, 1f1b, interleaved-1f1b, zero-bubble"),
    ("--microbatches", int, "micro-batches a batch is cut into for the pipeline, 1 to 256"),
)


def option_field(flag: str) -> str:
    """ "--comm-hook" -> "comm_hook": the API field, as the engine names its attribute."""
    return flag.removeprefix("--").replace("-", "_")


# Launch flags and the API fields they fill; flags not given are not sent (the form's defaults).
LAUNCH_FIELDS = {
    "name": "name",
    "model": "model",
    "dataset": "dataset",
    "data_path": "data_path",
    "strategy": "strategy",
    "nproc": "processes",
    "nodes": "nodes",
    "machines": "machines",
    "gpus": "gpus",
    "epochs": "epochs",
    "batch_size": "batch_size",
    "lr": "lr",
    "optimizer": "optimizer",
    "seed": "seed",
    "model_size": "model_size",
    "seq_len": "seq_len",
    "sequence_parallel": "sequence_parallel",
    "backend": "backend",
    "partition": "partition",
    "time_limit_minutes": "time_limit_minutes",
    **{option_field(flag): option_field(flag) for flag, _, _ in OPTION_FLAGS},
}


def fail(message: str, code: int) -> int:
    print(f"trainyard: {message}", file=sys.stderr)
    return code


def api_of(args: argparse.Namespace) -> Api:
    profile = profile_resolve(url=args.url, token=args.token)
    return Api(url=profile.url, token=profile.token)


def gpus_parse(text: str) -> list[Any]:
    """ "0,1" -> [0, 1]; an item that is not a number is sent as it is, for the server to refuse
    in its own words."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    return [int(item) if item.isascii() and item.isdigit() else item for item in items]


def run_ended(run: dict[str, Any]) -> int:
    """Say how a run ended (stdout when it succeeded, stderr otherwise); its exit code."""
    status = str(run.get("status"))
    accuracy = run.get("test_accuracy")
    figure = f", test accuracy {accuracy:.2%}" if isinstance(accuracy, int | float) else ""
    line = f"run #{run['id']} {status}{figure}"
    if status == "succeeded":
        print(line)
        return EXIT_OK
    why = run.get("error") or "no reason given"
    print(f"trainyard: {line}: {why}", file=sys.stderr)
    return EXIT_BY_STATUS.get(status, EXIT_FAILED)


def _token_read() -> str:
    # From stdin, the key stays out of the shell's history and the process list; typed or
    # pasted at a terminal, it is not echoed either.
    if sys.stdin.isatty():
        return getpass.getpass("Token: ").strip()
    return sys.stdin.readline().strip()


def cmd_login(args: argparse.Namespace) -> int:
    url = url_normalize(args.server)
    token = _token_read() if args.token_stdin else args.token
    if not token:
        username = args.username or input("Username: ")
        if args.password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = getpass.getpass("Password: ")
        token = token_create(url=url, username=username, password=password, name=args.name)
    # Check the token before keeping it: a typo is caught now, not at the first launch.
    Api(url=url, token=token).experiments()
    path = config_save(url=url, token=token)
    print(f"logged in to {url}; token saved in {path}")
    return EXIT_OK


def cmd_launch(args: argparse.Namespace) -> int:
    fields = {
        api_field: getattr(args, flag)
        for flag, api_field in LAUNCH_FIELDS.items()
        if getattr(args, flag) is not None
    }
    if "gpus" in fields:
        fields["gpus"] = gpus_parse(fields["gpus"])
    if "machines" in fields:
        fields["machines"] = [
            name.strip() for name in fields["machines"].split(",") if name.strip()
        ]
    api = api_of(args)
    run = api.launch(fields)
    if not args.watch:
        print(run["id"])
        return EXIT_OK
    print(f"run #{run['id']} launched: {api.url}{run['url']}", file=sys.stderr)
    return watch_to_end(api, run["id"], show_logs=args.logs)


def cmd_watch(args: argparse.Namespace) -> int:
    return watch_to_end(api_of(args), args.id, show_logs=args.logs)


def watch_to_end(api: Api, pk: int, *, show_logs: bool) -> int:
    try:
        return run_ended(run_follow(api, pk, show_logs=show_logs))
    except KeyboardInterrupt:
        # Ctrl-C ends the watching, not the run: say so, since both are plausible readings.
        return fail(
            f"stopped watching; run #{pk} goes on (`trainyard stop {pk}` stops it)",
            EXIT_INTERRUPTED,
        )


def cmd_list(args: argparse.Namespace) -> int:
    runs = api_of(args).experiments()
    if args.format == "json":
        json.dump(runs, sys.stdout, indent=2)
        print()
        return EXIT_OK
    print(
        f"{'ID':>6}  {'STATUS':<10} {'STRATEGY':<15} {'MODEL':<16} {'PROCS':>5} {'EPOCHS':>6} "
        f"{'ACC':>7}  NAME"
    )
    for run in runs:
        accuracy = run.get("test_accuracy")
        acc = f"{accuracy:.2%}" if isinstance(accuracy, int | float) else "-"
        print(
            f"{run['id']:>6}  {run['status']:<10} {run['strategy']:<15} "
            f"{run.get('model') or 'simple-cnn':<16} {run['processes']:>5} "
            f"{run['epochs']:>6} {acc:>7}  {run['name']}"
        )
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    run = api_of(args).stop(args.id)
    print(f"run #{run['id']}: stop requested ({run['status']})")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    # The last lines come with the run's snapshot; --follow then prints new ones until it ends.
    query = f"rank={args.rank}" if args.rank is not None else ""
    api = api_of(args)
    run_follow(api, args.id, stream=sys.stdout, only_logs=True, follow=args.follow, query=query)
    return EXIT_OK


def cmd_metrics(args: argparse.Namespace) -> int:
    points = api_of(args).metrics(args.id)
    if args.format == "json":
        json.dump(points, sys.stdout, indent=2)
        print()
        return EXIT_OK
    extra = sorted({key for point in points for key in point} - set(METRIC_COLUMNS))
    writer = csv.DictWriter(sys.stdout, fieldnames=[*METRIC_COLUMNS, *extra], lineterminator="\n")
    writer.writeheader()
    writer.writerows(points)
    return EXIT_OK
