"""What a user's script sees of the worker's environment: the names a training process needs
(paths, locale, the accelerators' and libraries' own settings), never the server's secrets.

The worker's environment holds the dashboard's database URL, its SECRET_KEY, the broker's
URL and whatever else the deployment set; a script runs arbitrary code as the worker's user, and
the engine's own runs need none of it either. An allowlist, not a denylist: a secret added to a
deployment tomorrow stays out without anyone remembering this file. TRAINYARD_SCRIPT_ENV names
more variables to pass (comma-separated), for a site whose scripts need them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "HOSTNAME",
    "TMPDIR", "TEMP", "TMP", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY",
    "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
})  # fmt: skip
PREFIXES = ("LC_", "XDG_", "CUDA_", "NCCL_", "GLOO_", "OMP_", "MKL_", "KMP_", "TORCH",
            "PYTORCH_", "NVIDIA_", "TRITON_", "HF_", "TRANSFORMERS_",
            # Trainyard's own settings of a script run's launcher and ranks (the stall watch's
            # floor, the observer's windows, the ranks' agreement: docs/guides/settings.md), set
            # on the worker.
            "TRAINYARD_STALL_", "TRAINYARD_OBSERVE", "TRAINYARD_AGREE_")  # fmt: skip


def script_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `environ` (the worker's) a script run's processes are given."""
    environ = os.environ if environ is None else environ
    extra = {n.strip() for n in environ.get("TRAINYARD_SCRIPT_ENV", "").split(",") if n.strip()}
    return {
        name: value
        for name, value in environ.items()
        if name in NAMES or name in extra or name.startswith(PREFIXES)
    }
