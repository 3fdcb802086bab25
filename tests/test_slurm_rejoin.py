"""srun's labelled output made back into its tasks' lines (runs/slurm/rejoin.py). The pieces here
are cut as the test cluster's srun 22.05 cut them (tests/test_slurm.py runs the real one): a line
longer than 1023 bytes comes as pieces of exactly 1024 bytes, each written as "N: <piece>\\n", and
other tasks' lines, on the same stream or the other, come between them."""

from __future__ import annotations

import json
import sys

from dashboard.experiments.runs.process import training_popen
from dashboard.experiments.runs.slurm.node_sampler import SAMPLE_PREFIX
from dashboard.experiments.runs.slurm.rejoin import PIECE_BYTES, TaskLines
from dashboard.experiments.runs.slurm.step import SlurmStepProcess
from dashboard.experiments.scheduling.slurm.parse import SlurmNode


def labelled(task: str, line: str) -> list[bytes]:
    """srun --label's lines for a task's `line` (its newline included): slurmstepd's pieces."""
    data, label, pieces = line.encode(), f"{task}: ".encode(), []
    assert data.endswith(b"\n") and b"\n" not in data[:-1], "one line at a time"
    while len(data) > PIECE_BYTES:  # no newline in its first 1023 bytes
        pieces.append(label + data[:PIECE_BYTES] + b"\n")
        data = data[PIECE_BYTES:]
    return [*pieces, label + data]


def step_event(ranks: int) -> str:
    """A step event with every rank's breakdown: about 600 bytes a rank."""
    breakdown = {f"phase_{k}": 0.000123 * k for k in range(24)}
    ranks_ = [{"rank": r, "breakdown": breakdown} for r in range(ranks)]
    return json.dumps({"v": 1, "type": "step", "step": 7, "ranks": ranks_}) + "\n"


def test_a_line_cut_many_times_around_other_tasks_lines_comes_whole() -> None:
    event = step_event(8)
    event_pieces = labelled("0", event)
    assert len(event_pieces) >= 4  # cut 3 times and more
    other = [labelled("1", f"a log line {i} of rank 8\n")[0] for i in range(len(event_pieces))]
    # Task 2's long line is cut at the same time, its pieces between task 0's.
    long_two = "x" + "é" * 1500 + "\n"  # 3002 bytes, its pieces ending inside a character
    two_pieces = labelled("2", long_two)
    assert two_pieces[0][-2:] == b"\xc3\n"  # "é" is c3 a9
    came = []
    for k, piece in enumerate(event_pieces):
        came += [piece, other[k], *two_pieces[k : k + 1]]
    came.insert(1, b"srun: error: n3: task 3: Exited with exit code 1\n")  # srun's own
    lines = TaskLines()
    whole = []
    for raw in came:
        whole += lines.take(raw.decode("utf-8", "surrogateescape"))
    assert event in whole and long_two in whole
    assert len(whole) == 2 + len(other) + 1
    assert [w for w in whole if w and w.startswith("a log")] == [o[3:].decode() for o in other]
    assert "srun: error: n3: task 3: Exited with exit code 1\n" in whole
    assert lines.take(None) == [None]  # nothing held


def test_the_cut_falls_where_slurmstepd_cuts() -> None:
    lines = TaskLines()
    # 1023 bytes and its newline fit one message: whole at once.
    assert lines.take("0: " + "a" * 1023 + "\n") == ["a" * 1023 + "\n"]
    # 1024 bytes: the message is full before the newline, which comes as a piece of its own.
    assert lines.take("0: " + "b" * 1024 + "\n") == []
    assert lines.take("0: \n") == ["b" * 1024 + "\n"]
    # Ten tasks and more: the labels are padded to the widest number.
    assert lines.take(" 3: " + "c" * 1024 + "\n") == []
    assert lines.take("12: twelve\n") == ["twelve\n"]
    assert lines.take(" 3: end\n") == ["c" * 1024 + "end\n"]
    # A task's last piece, held when the stream ended, is passed on before the end.
    assert lines.take("1: " + "d" * 1024 + "\n") == []
    assert lines.take(None) == ["d" * 1024 + "\n", None]


def test_the_step_reads_its_tasks_lines_whole_from_both_streams() -> None:
    """srun's bytes from a process (a piece ending inside a character, which strict decoding
    would refuse), through SlurmStepProcess as the supervisor reads it."""
    event, sample = step_event(8), SAMPLE_PREFIX + '{"machine/n2/cpu_percent": 5}\n'
    log_line = "x" + "ü" * 700 + "\n"  # cut between the two bytes of a "ü"
    out = [*labelled("0", event)]
    err = [*labelled("1", sample), *labelled("0", log_line)]
    out[1:1] = labelled("1", "rank 1 says hello\n")
    err[2:2] = labelled("1", "rank 1's log\n")
    script = (f"import sys; sys.stdout.buffer.write({b''.join(out)!r}); "
              f"sys.stderr.buffer.write({b''.join(err)!r})")  # fmt: skip
    popen = training_popen(command=[sys.executable, "-c", script], env={}, cwd="/",
                           errors="surrogateescape")  # fmt: skip
    nodes = [SlurmNode(name, "", 1, 0, "", name) for name in ("n1", "n2")]
    process = SlurmStepProcess(popen, job_id="7", nodes=nodes)
    lines, closed = [], 0
    for _ in range(200):
        source, text = process.line_next(1.0)
        closed += text is None
        if closed == 2:
            break
        if text:
            lines.append((source, text))
    popen.wait()
    said = [("stdout", event), ("stdout", "rank 1 says hello\n"), ("stderr", log_line),
            ("stderr", "rank 1's log\n")]  # fmt: skip
    assert sorted(lines) == sorted(said)
    assert process.samples_take() == [{"machine/n2/cpu_percent": 5.0}]
