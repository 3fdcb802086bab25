"""`trainyard`: what a user runs or imports on their own machine, light and apart from the server.

The `trainyard` command (`cli.py`: launch, watch and stop Trainyard runs from a terminal), and
the library users' scripts import (`trainyard.init()`, `run.py`: figures per rank, a Stop and
checkpoint requests the ranks agree on). Plain Python over HTTP and WebSocket (requests,
websockets, tqdm, imported only by the modules that use them): it never imports Django, the
dashboard or the engine (but the protocol's one home, training/protocol.py), nor torch outside
the ranks' agreement (agree.py, inside a script that imported it already), so it runs on any
machine that can reach the server (import-linter checks, and tests/test_client.py checks the
installed command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.run import Run


def init(url: str | None = None, token: str | None = None, name: str | None = None) -> Run:
    """This rank's run (trainyard.run.Run; outside a launch, reported to the server `url` or
    TRAINYARD_URL names: report.py); imported at the call: `import trainyard` stays cheap."""
    from trainyard.run import init as run_init

    return run_init(url=url, token=token, name=name)
