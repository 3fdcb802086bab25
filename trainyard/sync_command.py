"""`trainyard sync FOLDER`: send what a script reporting from outside (trainyard.init with a
server: report.py) could not send before it ended, from its spool folder (spool.py). The server
stores what it has not got yet, so a second sync, or one of a spool partly sent, stores nothing
twice."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from trainyard.api import Api
from trainyard.commands import EXIT_OK
from trainyard.config import ConfigError, profile_resolve
from trainyard.spool import (
    RankSpool,
    SpoolError,
    rank_send_all,
    run_find,
    spool_info_read,
    spool_ranks,
)


def sync_parser(sub: Any) -> argparse.ArgumentParser:
    sync = sub.add_parser(
        "sync",
        help="send the events a script reporting from outside left in its spool folder",
        description="Send what a script run outside Trainyard (trainyard.init with a server) "
        "could not send: FOLDER is its spool, as its last message named it. What the server "
        "has already is not stored again. The server is --url, else TRAINYARD_URL, else the "
        "one the script reported to.",
    )
    sync.add_argument("folder", metavar="FOLDER")
    sync.set_defaults(handler=cmd_sync)
    return sync


def cmd_sync(args: argparse.Namespace) -> int:
    """Each rank's events not yet acknowledged, in order, rank 0's last (its `done` ends the
    run, so the others' come first)."""
    folder = Path(args.folder)
    try:
        info = spool_info_read(folder)
    except SpoolError as exc:
        raise ConfigError(str(exc)) from None
    url = getattr(args, "url", None) or os.environ.get("TRAINYARD_URL") or info.url
    profile = profile_resolve(url=url, token=getattr(args, "token", None))
    api = Api(url=profile.url, token=profile.token)
    run_id = run_find(api=api, info=info)
    stored = duplicates = 0
    for rank in spool_ranks(folder):
        sent = rank_send_all(api=api, run_id=run_id, spool=RankSpool(folder, rank))
        stored, duplicates = stored + sent.stored, duplicates + sent.duplicates
    print(f"run {run_id} ({profile.url}/experiments/{run_id}/): {stored} event(s) stored, "
          f"{duplicates} the server had already")  # fmt: skip
    return EXIT_OK
