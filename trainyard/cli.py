"""The command line of `trainyard` (a console script of the trainyard package)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from trainyard import commands
from trainyard.api import ApiError
from trainyard.config import ConfigError
from trainyard.script_command import run_parser
from trainyard.serve_command import serve_parsers
from trainyard.sync_command import sync_parser

EPILOG = """\
exit codes: 0 the run succeeded (or the command did what it asked), 1 the run failed,
2 bad input, 3 the run was cancelled, 5 the server refused or is unreachable.
The server and token come from --url/--token, else TRAINYARD_URL/TRAINYARD_TOKEN, else the
file `trainyard login` writes (its token is sent to its own server only)."""


def _connection_flags(parser: argparse.ArgumentParser, *, default: object) -> None:
    # On the main parser and on each subcommand, so that `trainyard --url U list` and
    # `trainyard list --url U` both work (SUPPRESS keeps a subcommand from erasing the first).
    parser.add_argument("--url", default=default, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--token", default=default, help="an API token (see the Tokens page)")


def _launch_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    launch = sub.add_parser("launch", help="launch a run (the New run form's fields)")
    launch.add_argument("--name")
    launch.add_argument(
        "--model", help="simple-cnn (the default), a torchvision model such as resnet18, a plug-in"
    )
    launch.add_argument(
        "--dataset",
        help="mnist, fashion-mnist, imagefolder, jargon, textfolder, ... (what a worker has)",
    )
    launch.add_argument(
        "--data-path",
        help="with --dataset imagefolder or textfolder: the image or text folder, a path on the "
        "worker",
    )
    launch.add_argument("--strategy", help="single, dp, ddp, dp-primitives, model-parallel, ...")
    launch.add_argument(
        "--nproc", "--processes", dest="nproc", type=int, help="processes (ddp, hogwild, ...)"
    )
    launch.add_argument(
        "--nodes", type=int, help="machines the run spans (ddp, deepspeed); --nproc ranks on each"
    )
    launch.add_argument("--machines", help="worker names such as host-a,host-b to run on")
    launch.add_argument("--gpus", help="GPU ids such as 0,1; none for the CPU")
    launch.add_argument("--epochs", type=int)
    launch.add_argument("--batch-size", type=int)
    launch.add_argument("--lr", type=float)
    launch.add_argument("--optimizer", help="adam or sgd")
    launch.add_argument("--seed", type=int)
    # A language model's (issue 36), as the engine's CLI names them.
    launch.add_argument(
        "--model-size", help="byte-llama's size: smoke, small (the default), medium, large"
    )
    launch.add_argument("--seq-len", type=int, help="a language model's window, in bytes")
    launch.add_argument(
        "--sequence-parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tensor parallel's sequence parallel (on unless --no-sequence-parallel)",
    )
    # Where it runs (issue 37): the server's workers, or a Slurm cluster's batch job.
    launch.add_argument("--backend", help="celery (the workers) or slurm (a batch job)")
    launch.add_argument("--partition", help="with --backend slurm: the partition")
    launch.add_argument(
        "--time-limit-minutes", type=int, help="with --backend slurm: the job's time limit"
    )
    for flag, kind, text in commands.OPTION_FLAGS:
        if kind is None:  # a switch: true when given, else not sent (the default, off)
            launch.add_argument(flag, action="store_const", const=True, default=None, help=text)
        else:
            launch.add_argument(flag, type=kind, help=text)
    launch.add_argument("--watch", action="store_true", help="follow it to the end")
    launch.add_argument("--logs", action="store_true", help="with --watch: print its log too")
    launch.set_defaults(handler=commands.cmd_launch)
    return launch


def _run_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    watch = sub.add_parser("watch", help="follow a run live until it ends")
    watch.add_argument("id", type=int)
    watch.add_argument("--logs", action="store_true", help="print its log lines too")
    watch.set_defaults(handler=commands.cmd_watch)
    stop = sub.add_parser("stop", help="stop a run")
    stop.add_argument("id", type=int)
    stop.set_defaults(handler=commands.cmd_stop)
    logs = sub.add_parser("logs", help="a run's log lines")
    logs.add_argument("id", type=int)
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    logs.add_argument("--rank", type=int, help="one rank's lines")
    logs.set_defaults(handler=commands.cmd_logs)
    metrics = sub.add_parser("metrics", help="a run's metric points")
    metrics.add_argument("id", type=int)
    metrics.add_argument("--format", choices=("csv", "json"), default="csv")
    metrics.set_defaults(handler=commands.cmd_metrics)
    listing = sub.add_parser("list", help="your runs, newest first")
    listing.add_argument("--format", choices=("table", "json"), default="table")
    listing.set_defaults(handler=commands.cmd_list)
    return [watch, stop, logs, metrics, listing]


def parser_build() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainyard",
        description="Launch, watch and stop Trainyard training runs; serve the dashboard "
        "(server) and train on this machine (worker).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _connection_flags(parser, default=None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    login = sub.add_parser("login", help="save a server URL and a token for later commands")
    login.add_argument("server", metavar="URL")
    login.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help="use this token instead of asking for a username and password "
        "(it then stays in your shell history: prefer --token-stdin)",
    )
    login.add_argument(
        "--token-stdin",
        action="store_true",
        help="read the token from stdin (paste it, or pipe it)",
    )
    login.add_argument("--username")
    login.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    login.add_argument("--name", default="trainyard CLI", help="the new token's name")
    login.set_defaults(handler=commands.cmd_login)
    commands_all = (_launch_parser(sub), *_run_parsers(sub), run_parser(sub), sync_parser(sub))
    for command in commands_all:
        _connection_flags(command, default=argparse.SUPPRESS)
    serve_parsers(sub)  # the server's side, from an installed wheel: no --url, no token
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser_build().parse_args(argv)
    try:
        code: int = args.handler(args)
    except ConfigError as exc:
        return commands.fail(str(exc), commands.EXIT_USAGE)
    except ApiError as exc:
        bad_input = exc.status in {400, 413}
        return commands.fail(
            "\n".join(exc.lines()), commands.EXIT_USAGE if bad_input else commands.EXIT_ERROR
        )
    except KeyboardInterrupt:
        return commands.fail("interrupted", commands.EXIT_INTERRUPTED)
    return code


if __name__ == "__main__":
    sys.exit(main())
