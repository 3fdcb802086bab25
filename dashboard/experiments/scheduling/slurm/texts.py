"""What the pages and the read JSON say of a run's Slurm job: one home for the sentences."""

from __future__ import annotations


def pending_text(*, job_id: str, state: str, reason: str) -> str:
    """A queued run's waiting reason while its job waits ("Resources", "Priority",
    "QOSMaxJobsPerUserLimit": Slurm's own word, as squeue says it), or starts."""
    if state in ("RUNNING", "CONFIGURING"):
        return f"starting in Slurm job {job_id}"
    why = f": {reason}" if reason else ""
    return f"waiting in Slurm: job {job_id} is {state.lower()}{why}"


def submitted_text(*, job_id: str) -> str:
    return f"submitted to Slurm as job {job_id}"


def refused_text(*, error: str) -> str:
    return f"Slurm refused the run's job: {error}"


def requeued_text(*, job_id: str, attempt: int) -> str:
    return f"its Slurm job {job_id} was requeued (attempt {attempt}'s processes were ended)"


def cancelled_outside_text(*, job_id: str, state: str, reason: str) -> str:
    """A run whose job ended from outside Trainyard: an administrator's scancel, a failure."""
    why = f" ({reason})" if reason else ""
    return f"its Slurm job {job_id} ended outside Trainyard: {state}{why}"


def vanished_text(*, job_id: str) -> str:
    return f"its Slurm job {job_id} is gone from the cluster's queue"


def silent_text(*, job_id: str, seconds: float) -> str:
    return f"no heartbeat from its Slurm job {job_id} for {seconds:.0f} s; the job is cancelled"


def job_text(
    *, job_id: str, state: str, reason: str, partition: str, time_limit_minutes: int | None
) -> str:
    """The run page's "Slurm job" line: the job, its state and Slurm's reason, and what it asked
    for ("4811 (pending: Resources), partition gpu, 30 min"), on a reload and live."""
    said = "not submitted yet"
    if job_id:
        why = f": {reason}" if reason else ""
        said = f"{job_id} ({state.lower() or 'submitted'}{why})"
    if partition:
        said += f", partition {partition}"
    if time_limit_minutes:
        said += f", {time_limit_minutes} min"
    return said
