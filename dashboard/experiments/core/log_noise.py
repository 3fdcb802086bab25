"""Lines of the libraries under a run that look alarming and are known to mean nothing for it.

Kept in the log (a person may still want them), at their own level, ``noise``, below info (the
page's "info and worse" leaves them out), each with why it is harmless after it. A pattern here
must be specific enough to never match a real failure.
"""

from __future__ import annotations

import re
from typing import Final

NOISE_LEVEL: Final = "noise"

# (what the line holds, why it is harmless), the why as the log shows it.
KNOWN_NOISE: Final = (
    (
        re.compile(r"\bgpuGetDeviceCount failed with code 35\b"),
        "PyTorch's profiler looked for a GPU on a machine without one",
    ),
    (
        re.compile(r"\bActivityProfilerHandler\.cpp:\d+\] profiler_(start|stop)$"),
        "PyTorch's profiler saying that it started or stopped",
    ),
)


def noise_text(line: str) -> str | None:
    """The log's words for ``line`` where it is known noise (the line, then why it is
    harmless), else None."""
    for pattern, why in KNOWN_NOISE:
        if pattern.search(line):
            return f"{line} (harmless: {why})"
    return None
