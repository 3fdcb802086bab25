"""``python -m training --strategy script``: a user's script under torchrun, spoken for.

The launcher starts torchrun over ``training.scripts.rank`` (the observer of each step's phases,
observer.py, then the entry point run as ``python ENTRY ARGS`` would), each rank's output tagged
by torchrun (``--tee``) and passed on to stderr as that rank's log lines, and reads the events
the ranks' trainyard library and the observer write (channel.py) to write them on stdout as this
run's protocol events. It is the process a Stop
and a checkpoint request are sent to (``stop_pid``, ``requests_pid``): SIGTERM writes a stop
into the control file (control.py) the ranks agree on, then waits ``--stop-grace`` seconds for
them to save and leave before it ends what is left, naming each rank it had to end; SIGUSR1
asks for a checkpoint the same way. A script none of whose ranks asks ``run.should_stop()``
is ended at once on a Stop: nothing in it would hear the request. SIGUSR2 asks for a profile
(--profile-dir's request.json says of how many steps), which the ranks' observers record
(profiles.py).
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import IO, Any

from training.config import ScriptSettings, TrainConfig
from training.observe.stall import StallWatch, stall_floor
from training.process.run_requests import profile_request_read, profile_request_take
from training.process.torchrun import (
    socket_interfaces_set,
    torchrun_rank_output,
    torchrun_rendezvous,
)
from training.process.tree import OutputLine, output_lines_forward, process_tree_stop
from training.protocol import EventWriter, ScriptInfo
from training.scripts.channel import OBSERVER_FILE, RankEvents
from training.scripts.control import (
    PROFILE_DIR_ENV,
    Requests,
    profiles_refusal,
    requests_write,
)
from training.scripts.output import RANK_PREFIX, rank_line
from training.scripts.provenance import git_state, packages_installed

log = logging.getLogger("training")

EXIT_FAILED = 1
EXIT_STOPPED = 143  # as a process ended by SIGTERM: the run ended because it was asked to
POLL_SECONDS = 0.1
KILL_GRACE_SECONDS = 5.0  # after the Stop's grace: torchrun's SIGTERM, then SIGKILL
TAIL_LINES = 30
# What a rank's event carries besides its type's fields (its own envelope and rank).
ENVELOPE_KEYS = frozenset({"v", "minor", "run", "seq", "type", "time", "rank"})


class ScriptLauncher:
    def __init__(self, cfg: TrainConfig, events: EventWriter):
        assert cfg.script is not None
        self.cfg, self.script, self.events = cfg, cfg.script, events
        # On several machines each launcher passes its own ranks' figures on; the first alone
        # says what the run is, what it saved and how it ended.
        self.chief = cfg.nnodes <= 1 or cfg.rdzv_host
        self.folder = Path(tempfile.mkdtemp(prefix="trainyard-script-"))
        self.control = self.folder / "control.json"
        self.requests = Requests()
        self.rank_events = RankEvents(self.folder)
        self.observer_events = RankEvents(self.folder, names=OBSERVER_FILE)
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)  # torchrun's and the ranks' stderr
        self.rank_tails: dict[int, deque[str]] = {}  # each rank's own stderr
        self.hello: dict[int, int] = {}  # rank -> pid, of the ranks that run the library
        self.listening: set[int] = set()  # the ranks that ask whether to stop
        self.stopping: dict[int, int] = {}  # rank -> the step it agreed to stop at
        self.done: set[int] = set()
        self.step = 0  # rank 0's latest step
        self.stop_asked = False
        self.stop_deadline: float | None = None
        self.checkpoints_asked = 0
        self.killed: list[str] = []
        self.started_at = time.monotonic()
        self.stall = StallWatch(self.folder, floor=stall_floor(os.environ))
        # Profiles on request: where the ranks write them, or why they cannot.
        self.profile_refusal = profiles_refusal(profile_dir=cfg.profile_dir, env=os.environ)
        self.profile_dir = None if self.profile_refusal else cfg.profile_dir

    # ---- signals: the handlers only note; the loop acts ----------------------------------
    def signals_install(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            self.stop_asked = True

        def checkpoint(signum: int, frame: FrameType | None) -> None:
            self.checkpoints_asked += 1

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGUSR1, checkpoint)

    # ---- the run ---------------------------------------------------------------------------
    def run(self) -> int:
        requests_write(path=self.control, requests=self.requests)
        self.signals_install()
        if self.chief:
            started_emit(self)
        process = self.torchrun_start()
        lines: queue.Queue[OutputLine] = queue.Queue()
        for stream, source in ((process.stdout, "stdout"), (process.stderr, "stderr")):
            threading.Thread(target=output_lines_forward, args=(stream, source, lines),
                             daemon=True).start()  # fmt: skip
        open_streams = 2
        try:
            while open_streams or process.poll() is None:
                try:
                    source, line = lines.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    source, line = "", ""
                if line is None:
                    open_streams -= 1
                elif line:
                    self.line_take(source, line)
                self.events_take()
                self.windows_take()
                self.requests_take(process)
                self.profile_take()
                self.stall_take()
            self.events_take()
            self.windows_take()
            return final_say(self, process.wait())
        finally:
            _process_end(process, grace=KILL_GRACE_SECONDS)
            shutil.rmtree(self.folder, ignore_errors=True)

    def torchrun_start(self) -> subprocess.Popen[str]:
        cfg, script = self.cfg, self.script
        command = [
            sys.executable, "-m", "torch.distributed.run", *torchrun_rendezvous(cfg),
            f"--nproc-per-node={cfg.nproc}", *torchrun_rank_output(streams=3),
            "-m", "training.scripts.rank", "--", script.entrypoint, *script.args,
        ]  # fmt: skip
        return subprocess.Popen(  # noqa: S603 - the user's own script is what a script run is
            command,
            cwd=script.code_dir,
            env=self.rank_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            errors="replace",
        )

    def rank_environment(self) -> dict[str, str]:
        cfg = self.cfg
        env = dict(os.environ)
        if cfg.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, cfg.gpus))
        if cfg.nnodes > 1:
            socket_interfaces_set(env, cfg.local_addr)
        # The ranks import trainyard (and its protocol) from this checkout, wherever the code is.
        root = str(Path(__file__).resolve().parents[2])
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([root, *(p for p in paths if p != root)])
        env.update(
            PYTHONUNBUFFERED="1",
            TRAINYARD_RUN_ID=cfg.run_id,
            TRAINYARD_EVENTS_DIR=str(self.folder),
            TRAINYARD_CONTROL=str(self.control),
        )
        env.pop(PROFILE_DIR_ENV, None)
        if self.profile_dir is not None:
            env[PROFILE_DIR_ENV] = self.profile_dir
        if cfg.checkpoint_dir:
            Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            env["TRAINYARD_CHECKPOINT_DIR"] = cfg.checkpoint_dir
        env.pop("TRAINYARD_RESUME_PATH", None)
        if cfg.resume:
            env["TRAINYARD_RESUME_PATH"] = cfg.resume
        else:  # the step of a checkpoint resumed from (the dashboard's): none without one
            env.pop("TRAINYARD_RESUME_STEP", None)
        return env

    # ---- what the ranks write and say ----------------------------------------------------
    def line_take(self, source: str, line: str) -> None:
        shown = rank_line(source, line)
        if source == "stderr":
            self.tail.append(line.rstrip("\n"))
            if (found := RANK_PREFIX.match(line)) is not None:
                tail = self.rank_tails.setdefault(int(found[1]), deque(maxlen=TAIL_LINES))
                tail.append(line[found.end() :].rstrip("\n"))
        sys.stderr.write(shown)
        sys.stderr.flush()

    def events_take(self) -> None:
        for event in self.rank_events.read():
            rank = event.get("rank")
            if not isinstance(rank, int) or isinstance(rank, bool):
                continue
            kind = event["type"]
            if kind == "hello" and isinstance(event.get("pid"), int):
                self.hello[rank] = event["pid"]
            elif kind == "listening":
                self.listening.add(rank)
            elif kind == "stopping":
                self.stopping[rank] = _count(event.get("step"))
            elif kind == "done":
                self.done.add(rank)
            elif kind == "metrics":
                self.metrics_emit(event, rank=rank)
            elif kind == "checkpoint" and rank == 0:  # the launcher of rank 0 (windows_take)
                self.events.emit(
                    "checkpoint", epoch=0, step=_count(event.get("step")),
                    path=str(event.get("path")), requested=event.get("requested") is True,
                    answers_request=event.get("answers_request") is True,
                )  # fmt: skip

    def windows_take(self) -> None:
        """The observer's windows (rank 0's): each a `step` event with every rank's phases,
        passed on as the engine's are; and its `profile` events. Only the launcher of rank 0
        reads any, and it need not be the first machine's: torchrun's c10d rendezvous numbers
        the machines by address, then its agent's PID (so under srun, or on one host, either)."""
        for event in self.observer_events.read():
            window = event["type"] == "step" and isinstance(event.get("ranks"), list)
            if window or event["type"] == "profile":
                fields = {k: v for k, v in event.items() if k not in ENVELOPE_KEYS}
                self.events.emit(event["type"], **fields)

    def stall_take(self) -> None:
        """A stall begun or over, said (stall.py; the first machine's ranks, by the first
        machine's launcher: the others' ranks are not seen from here). Not after a Stop."""
        if not self.chief or self.stop_asked:
            return
        fields = self.stall.check(time.time())
        if fields is not None:
            self.events.emit("stalled", **fields)

    def metrics_emit(self, event: dict[str, Any], *, rank: int) -> None:
        values = event.get("values")
        if not isinstance(values, dict):
            return
        step = _count(event.get("step"))
        if rank == 0:
            self.step = step
        self.events.emit("metrics", step=step, rank=rank, values=values)

    # ---- requests ----------------------------------------------------------------------------
    def profile_take(self) -> None:
        """A profile request (SIGUSR2) passed on to the ranks in the control file, whose
        observers agree on the step to start at; refused here where they cannot record it."""
        if not profile_request_take():
            return
        found = (
            profile_request_read(Path(self.profile_dir))
            if self.profile_dir is not None
            else f"this script run takes no profile requests: {self.profile_refusal}"
        )
        if isinstance(found, str):
            self.events.emit("profile", profile=0, state="refused", steps=0, message=found)
            return
        self.requests.profile, self.requests.profile_steps = found.profile, found.steps
        requests_write(path=self.control, requests=self.requests)

    def requests_take(self, process: subprocess.Popen[str]) -> None:
        if self.checkpoints_asked != self.requests.checkpoint and not self.stop_asked:
            self.requests.checkpoint = self.checkpoints_asked
            requests_write(path=self.control, requests=self.requests)
            if not self.hello:
                self.events.log(
                    "Checkpoint requested, but no rank of this script has called "
                    "trainyard.init(): nothing in it hears the request.", level="warning",
                )  # fmt: skip
        if self.stop_asked and self.stop_deadline is None:
            self.stop_begin(process)
        if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
            self.stop_deadline = float("inf")  # once
            self.ranks_end(process)

    def stop_begin(self, process: subprocess.Popen[str]) -> None:
        self.requests.stop = True
        requests_write(path=self.control, requests=self.requests)
        if self.listening:
            self.stop_deadline = time.monotonic() + self.script.stop_grace
            self.events.log(
                f"Stop asked: every rank stops at the same step, saves and leaves (within "
                f"{self.script.stop_grace:g} s).",
            )
        else:
            self.stop_deadline = float("inf")
            self.events.log("Stop asked: no rank of this script asks trainyard whether to stop "
                            "(run.should_stop()); ending its processes.")  # fmt: skip
            _process_end(process, grace=KILL_GRACE_SECONDS)

    def ranks_end(self, process: subprocess.Popen[str]) -> None:
        """The Stop's grace is over: end what is left, and name the ranks that had not left."""
        left = sorted(rank for rank in self.hello if rank not in self.done)
        _process_end(process, grace=KILL_GRACE_SECONDS)
        for rank in left:
            self.killed.append(f"rank {rank} (pid {self.hello[rank]})")
        if self.killed:
            self.events.log(
                f"{', '.join(self.killed)} had not left {self.script.stop_grace:g} s after the "
                "Stop and were ended.", level="warning",
            )  # fmt: skip


def started_emit(launcher: ScriptLauncher) -> None:
    """The run's `started` event: what runs where, the script's record, whom to signal."""
    cfg, script = launcher.cfg, launcher.script
    world = cfg.nproc * cfg.nnodes
    device = "cuda" if cfg.gpus else "cpu"
    launcher.events.emit(
        "started", strategy="script", world_size=world, device=device,
        devices=[device] * world, dataset="", dataset_source="the script's own",
        train_size=0, test_size=0, epochs=0, start_epoch=0, batch_size=0,
        global_batch_size=0, steps_per_epoch=0, total_steps=0, optimizer="", lr=0.0,
        seed=0, dry_run=False, torch_version=_torch_version(), pids=[],
        launcher_pid=os.getpid(), notes=script_notes(script, world=world, cfg=cfg),
        requests_pid=os.getpid(), stop_pid=os.getpid(),
        script=script_info(script),
        profile_dir=launcher.profile_dir,
    )  # fmt: skip


def final_say(launcher: ScriptLauncher, returncode: int) -> int:
    """How the run ended, said (on the first machine), and the launcher's exit status."""
    if not launcher.chief:
        return 0 if returncode == 0 else (EXIT_STOPPED if launcher.stop_asked else EXIT_FAILED)
    if launcher.stop_asked:
        steps = sorted(set(launcher.stopping.values()))
        if steps and not launcher.killed:
            at = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps}"
            launcher.events.log(f"Stopped: {len(launcher.stopping)} rank(s) left at {at}.")
        return EXIT_STOPPED
    if returncode == 0:
        launcher.events.emit(
            "finished", test_loss=None, test_accuracy=None, epochs=0, epochs_run=0,
            steps=launcher.step, duration=round(time.monotonic() - launcher.started_at, 3),
        )  # fmt: skip
        return 0
    error, tail = f"your script exited with code {returncode}", list(launcher.tail)
    # The rank that raised: its traceback and last line, not torchrun's summary after it.
    for rank, lines in sorted(launcher.rank_tails.items()):
        if any(line.startswith("Traceback") for line in lines):
            error, tail = f"{error} (rank {rank}: {lines[-1].strip()})", list(lines)
            break
    launcher.events.emit("failed", error=error, traceback="\n".join(tail))
    return EXIT_FAILED


def script_info(script: ScriptSettings) -> ScriptInfo:
    info: ScriptInfo = {
        "entrypoint": script.entrypoint, "args": list(script.args), "code_dir": script.code_dir,
        "stop_grace": script.stop_grace, "packages": packages_installed(),
    }  # fmt: skip
    git = git_state(Path(script.code_dir))
    if git is not None:
        info["git"] = git
    return info


def script_notes(script: ScriptSettings, *, world: int, cfg: TrainConfig) -> list[str]:
    command = " ".join([script.entrypoint, *script.args])
    machines = f" on each of {cfg.nnodes} machines" if cfg.nnodes > 1 else ""
    return [f"Your script, {command}, runs as {cfg.nproc} rank(s){machines} under torchrun "
            f"({world} in all), in {script.code_dir}."]  # fmt: skip


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def _process_end(process: subprocess.Popen[str], *, grace: float) -> None:
    """End torchrun and its ranks (by PID: they live in sessions of their own), then reap it."""
    if process.poll() is None:
        process_tree_stop(root_pid=process.pid, extra_pids=[], grace_seconds=grace)
    process.wait()


def script_launch(cfg: TrainConfig, *, events_stream: IO[str]) -> int:
    return ScriptLauncher(cfg, EventWriter(cfg.run_id, stream=events_stream)).run()
