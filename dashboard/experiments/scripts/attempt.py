"""What a worker starts a script run's attempt with: the flags of the launcher (``python -m
training --strategy script``, which runs torchrun over the user's entry point and turns what the
``trainyard`` library reports inside each rank into protocol events), and the code folder.

The folder is the attempt's own: an upload unpacked afresh (scripts/code.py), or the folder on
the workers, checked against this worker's script roots, which may differ from the server's.
The supervisor (runs/runner.py) adds the folder, then resume and node flags, and the script's
arguments last, after ``--``: the launcher's parser stops there, so that an argument of the
script's that looks like one of its flags (``--nproc``) stays the script's.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from dashboard.experiments.core.profiles import profiles_dir
from dashboard.experiments.models import Experiment
from dashboard.experiments.scripts.code import CodeRefused, code_unpack_for_run
from dashboard.experiments.scripts.folders import code_path_refusal, entrypoint_refusal


class ScriptCodeUnavailable(Exception):
    """The attempt cannot start here: its code is not on this worker, or not where it may be.
    The attempt fails with this as its error."""


def script_flags(*, experiment: Experiment, checkpoint_dir: Path) -> list[str]:
    """The launcher's flags after its strategy's, less the attempt's code folder and the
    script's arguments."""
    flags = [
        "--nproc",
        str(experiment.processes),
        "--entrypoint",
        experiment.entrypoint,
        "--checkpoint-dir",
        str(checkpoint_dir),
        # After a Stop: the ranks' time to agree, save and leave, before they are killed.
        "--stop-grace",
        str(settings.TRAINYARD_SCRIPT_STOP_SECONDS),
        # Profiles on request, recorded by the ranks' observer (runs/profiles.py).
        "--profile-dir",
        str(profiles_dir(experiment_id=experiment.pk)),
    ]
    if experiment.gpus:
        flags += ["--gpus", ",".join(str(g) for g in experiment.gpus)]
    return flags


def script_code_folder(*, experiment: Experiment) -> Path:
    """The folder this attempt runs the script in, its entry point checked to be a file of it;
    ScriptCodeUnavailable says why there is none."""
    if experiment.code_id is not None:
        try:
            folder = code_unpack_for_run(experiment=experiment)
        except CodeRefused as refused:
            raise ScriptCodeUnavailable(f"the run's uploaded code: {refused}") from None
    else:
        refused_path = code_path_refusal(code_path=experiment.code_path)
        if refused_path:
            raise ScriptCodeUnavailable(f"the run's code folder on this worker: {refused_path}")
        folder = Path(experiment.code_path)
    missing = entrypoint_refusal(folder=folder, entrypoint=experiment.entrypoint)
    if missing:
        raise ScriptCodeUnavailable(f"the run's entry point: {missing}")
    return folder
