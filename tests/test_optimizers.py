"""The run's optimizers without torch.compile's hooks (training/strategies/optimizers.py): the
same numbers as torch's. That a run which does not compile never imports ``torch._dynamo`` is
checked with torchvision's import, on one whole run (test_training.py)."""

from __future__ import annotations

import copy as copy_module
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from training.config import parse_args
from training.strategies import optimizers
from training.strategies.common import optimizer_make


def _steps(cls: type[torch.optim.Optimizer], **hyper: float) -> tuple[nn.Module, dict]:
    """Three steps of ``cls`` on a small network, from the same start each time."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = cls(net.parameters(), **hyper)
    inputs, targets = torch.randn(32, 8), torch.randint(0, 4, (32,))
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(inputs), targets).backward()
        optimizer.step()
    return net, optimizer.state_dict()


@pytest.mark.parametrize(
    ("torch_class", "eager_class", "hyper"),
    [
        (torch.optim.Adam, optimizers.Adam, {"lr": 1e-3}),
        (torch.optim.SGD, optimizers.SGD, {"lr": 0.05, "momentum": 0.9}),
    ],
)
def test_the_eager_classes_step_to_the_same_numbers(
    torch_class: type[torch.optim.Optimizer],
    eager_class: type[torch.optim.Optimizer],
    hyper: dict[str, float],
) -> None:
    theirs, their_state = _steps(torch_class, **hyper)
    ours, our_state = _steps(eager_class, **hyper)
    for a, b in zip(theirs.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a, b)
    assert our_state["param_groups"] == their_state["param_groups"]
    for key, state in their_state["state"].items():
        for name, value in state.items():
            assert torch.equal(our_state["state"][key][name], value), name
    # Named and typed as torch's (notes say "Adam"), and picklable by reference.
    assert eager_class.__name__ == torch_class.__name__
    assert issubclass(eager_class, torch_class)
    assert pickle.loads(pickle.dumps(eager_class)) is eager_class


def test_the_step_keeps_the_grad_mode_of_its_caller() -> None:
    net = nn.Linear(2, 1)
    optimizer = optimizers.Adam(net.parameters())
    net(torch.ones(1, 2)).sum().backward()
    optimizer.step()  # without grad inside (parameters updated in place), with it after
    assert torch.is_grad_enabled()
    with torch.no_grad():
        optimizer.step()
        assert not torch.is_grad_enabled()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), optimizers.Adam),
        (("--optimizer", "sgd"), optimizers.SGD),
        (("--compile",), torch.optim.Adam),  # dynamo compiles around torch's own
    ],
)
def test_a_run_that_compiles_keeps_torchs_class(
    sample_data: Path, flags: tuple[str, ...], expected: type
) -> None:
    cfg = parse_args(["--data-dir", str(sample_data), *flags])
    assert type(optimizer_make(cfg, nn.Linear(2, 1))) is expected
    # What DeepSpeed is given, whatever the run: ZeRO checks for torch's own Adam.
    assert type(optimizer_make(cfg, nn.Linear(2, 1), eager=False)).__module__.startswith("torch")


def test_hooks_run_and_an_optimizer_copies_and_pickles() -> None:
    """Still torch's optimizer in every way but the compiler's: its step hooks (global and its
    own) run, and deepcopy and pickle give it back, state included."""
    net = nn.Linear(2, 1)
    optimizer = optimizers.Adam(net.parameters())
    seen: list[str] = []
    optimizer.register_step_pre_hook(lambda *_: seen.append("pre"))
    optimizer.register_step_post_hook(lambda *_: seen.append("post"))
    handle = register_optimizer_step_post_hook(lambda *_: seen.append("global"))
    try:
        net(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    finally:
        handle.remove()
    assert seen == ["pre", "post", "global"]
    for copy in (copy_module.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        assert type(copy) is optimizers.Adam
        assert torch.equal(
            copy.state_dict()["state"][0]["exp_avg"], optimizer.state[net.weight]["exp_avg"]
        )
