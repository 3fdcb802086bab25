"""`trainyard run [--nproc N] [--nodes M] [--gpus G] [--name NAME] SCRIPT [-- ARGS...]`: your
script as a Trainyard run. Packs the current folder (pack.py), uploads it (`POST /api/code/`),
launches it (strategy `script`, SCRIPT as the entry point, ARGS as its arguments) and watches
it to its end, as `launch --watch` does."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from trainyard.api import Api
from trainyard.commands import api_of, fail, gpus_parse, watch_to_end
from trainyard.pack import PackError, folder_pack

EXIT_USAGE = 2
UPLOAD_SECONDS = 300.0


def run_parser(sub: Any) -> argparse.ArgumentParser:
    run = sub.add_parser(
        "run",
        help="pack this folder, upload it and run SCRIPT under torchrun on a worker",
        description="Pack the current folder (what git would keep: .gitignore is honoured), "
        "upload it, launch SCRIPT under torchrun with the arguments after --, and watch it.",
    )
    run.add_argument("script", metavar="SCRIPT", help="the entry point, a file in this folder")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                     help="the script's own arguments, after --")  # fmt: skip
    run.add_argument("--nproc", type=int, help="ranks on each machine (default: the server's)")
    run.add_argument("--nodes", type=int, help="machines the run spans")
    run.add_argument("--gpus", help="GPU ids such as 0,1; none for the CPU")
    run.add_argument("--name", help="the run's name (default: the script's)")
    run.add_argument("--detach", action="store_true", help="print the run's id, do not watch")
    run.add_argument("--logs", action="store_true", help="print its log lines while watching")
    run.set_defaults(handler=cmd_run)
    return run


def code_upload(api: Api, data: bytes) -> dict[str, Any]:
    return dict(api.request("POST", "/api/code/", files={"archive": ("code.tar.gz", data)},
                            timeout=UPLOAD_SECONDS))  # fmt: skip


def cmd_run(args: argparse.Namespace) -> int:
    folder = Path.cwd()
    entry = Path(os.path.relpath(Path(args.script).resolve(), folder)).as_posix()
    script_args = args.args[1:] if args.args[:1] == ["--"] else args.args
    try:
        data, files = folder_pack(folder, entrypoint=entry)
    except PackError as exc:
        return fail(str(exc), EXIT_USAGE)
    api = api_of(args)
    code = code_upload(api, data)
    print(f"uploaded {files} files ({len(data):,} bytes, sha256 {code['sha256'][:12]})",
          file=sys.stderr)  # fmt: skip
    fields: dict[str, Any] = {"strategy": "script", "code": code["id"], "entrypoint": entry,
                              "args": list(script_args), "name": args.name or entry}  # fmt: skip
    for flag, field in (("nproc", "processes"), ("nodes", "nodes")):
        if getattr(args, flag) is not None:
            fields[field] = getattr(args, flag)
    if args.gpus is not None:
        fields["gpus"] = gpus_parse(args.gpus)
    run = api.launch(fields)
    if args.detach:
        print(run["id"])
        return 0
    print(f"run #{run['id']} launched: {api.url}{run['url']}", file=sys.stderr)
    return watch_to_end(api, run["id"], show_logs=args.logs)
