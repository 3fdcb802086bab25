"""``sample_data`` for the modules whose figures do not depend on how many test digits a run
evaluates on (equalities between runs, events, checkpoints, shapes): the sample with 200 of its
1,000 test digits (``few_test_digits`` in tests/conftest.py). Every run evaluates each epoch on
the whole test split, about 0.9 s of CPU for the 1,000 with the built-in model, minutes for
ViT-B and Inception v3; the suite runs hundreds. A module takes it by importing it:

    from tests.few_digits import sample_data_few  # noqa: F401 (the sample_data fixture)
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session", name="sample_data")
def sample_data_few(few_test_digits: Path) -> Path:
    return few_test_digits
