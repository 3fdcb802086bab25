"""The tests of Trainyard (docs/development.md, "Tests"); this package is imported before any
test module."""

import os

# Two pytest workers share 2 cores, each test's trainings in-process or in processes it starts
# (which inherit this): one intra-op thread each, else 4 threads contend for 2 cores (measured:
# the engine's heavy files took 238 s with torch's default, 185 s with this). Set before torch
# is imported (conftest imports this package first); the stack's runs get their threads from the
# runner (OMP_NUM_THREADS per rank), as in production.
os.environ.setdefault("OMP_NUM_THREADS", "1")
