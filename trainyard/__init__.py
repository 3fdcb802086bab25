"""`trainyard`: launch, watch and stop Trainyard runs from a terminal.

Plain Python over HTTP and WebSocket (requests, websockets, tqdm): it never imports Django or the
dashboard, so it runs on any machine that can reach the server (import-linter checks).
"""
