"""TensorBoard's SummaryWriter, its scalars as the run's series (W&B, ClearML and MLflow get
their "zero-code" figures the same way: by wrapping `add_scalar`). The events file is written
as before; each scalar also goes to `run.log` at its `global_step` (the next step when none).

Under a Trainyard launch every SummaryWriter attaches by itself; by hand,
`writer_class_patch(SummaryWriter)` before the writers are made.
"""

from __future__ import annotations

from typing import Any

from trainyard.integrations import figures_log


def writer_class_patch(writer_class: Any) -> None:
    add_scalar, add_scalars = writer_class.add_scalar, writer_class.add_scalars
    if getattr(add_scalar, "trainyard", False):
        return

    def scalar(self: Any, tag: str, scalar_value: Any, global_step: Any = None,
               *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        done = add_scalar(self, tag, scalar_value, global_step, *args, **kwargs)
        figures_log({tag: scalar_value}, step=_step(global_step))
        return done

    def scalars(self: Any, main_tag: str, tag_scalar_dict: dict[str, Any], global_step: Any = None,
                *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        done = add_scalars(self, main_tag, tag_scalar_dict, global_step, *args, **kwargs)
        figures = {f"{main_tag}/{tag}": value for tag, value in tag_scalar_dict.items()}
        figures_log(figures, step=_step(global_step))
        return done

    scalar.trainyard = True  # type: ignore[attr-defined]
    writer_class.add_scalar = scalar
    writer_class.add_scalars = scalars


def _step(global_step: Any) -> int | None:
    if global_step is None:
        return None
    return int(global_step.item() if hasattr(global_step, "item") else global_step)
