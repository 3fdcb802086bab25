"""The run's optimizer: Adam, or SGD with momentum, without torch.compile's hooks where nothing
compiles.

Five methods of every torch optimizer (``step``, ``zero_grad``, ``add_param_group``,
``state_dict``, ``load_state_dict``) are wrapped so that a graph being compiled breaks around them
or skips them, and each wrapper imports ``torch._dynamo`` when first called. That import takes a
second of CPU (it brings sympy, DTensor and FSDP along): a third of a rank's start-up, paid by
every process that steps, for a graph that a run without ``--compile`` never has. ``eager_class``
gives the same class with those five methods called directly: the same code and the same
numbers (a run's losses are bit-identical), ``step`` under the grad mode its wrapper sets. A run
with ``--compile`` keeps torch's own classes, and so does DeepSpeed's ZeRO, which checks the
class (training/strategies/deepspeed_zero.py).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

# The methods torch wraps for the compiler (torch/optim/optimizer.py): `step` in
# `_use_grad_for_differentiable`, the others in `torch._disable_dynamo`.
_WRAPPED = ("zero_grad", "add_param_group", "state_dict", "load_state_dict")


def eager_class(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """``cls`` with its compiler wrappers removed: named as it (notes say "Adam"), an instance of
    it (``isinstance`` holds), still hooked (``register_step_*``), and picklable as this
    module's attribute of that name."""
    methods: dict[str, Any] = {name: inspect.unwrap(getattr(cls, name)) for name in _WRAPPED}
    methods["step"] = _step_of(inspect.unwrap(cls.step))
    methods["__module__"] = __name__
    return type(cls.__name__, (cls,), methods)


def _step_of(step: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(step)
    def eager_step(self: torch.optim.Optimizer, closure: Any = None) -> Any:
        # What _use_grad_for_differentiable does around a step, but for the graph break.
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return step(self, closure)

    return eager_step


Adam = eager_class(torch.optim.Adam)
SGD = eager_class(torch.optim.SGD)


def optimizer_class(kind: str, *, eager: bool) -> Callable[..., torch.optim.Optimizer]:
    """``kind`` "sgd" or "adam"; ``eager``: this module's class, else torch's own."""
    if kind == "sgd":
        return SGD if eager else torch.optim.SGD
    return Adam if eager else torch.optim.Adam
