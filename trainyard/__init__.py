"""`trainyard`: what a user runs or imports on their own machine, light and apart from the server.

Today the `trainyard` command (`cli.py`: launch, watch and stop Trainyard runs from a terminal);
next, the library users' scripts import. Plain Python over HTTP and WebSocket (requests,
websockets, tqdm, imported only by the modules that use them): it never imports Django, the
dashboard, the engine or torch, so it runs on any machine that can reach the server
(import-linter checks, and tests/test_client.py checks the installed command).
"""
