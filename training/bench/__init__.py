"""Benchmarks of the training engine: ``python -m training.bench {engine,memory,parity,phases}``.

Commands, not tests: each prints a table and, as its last line, ``<name> ratio: <number>`` so
that a script can take the figure (``tail -1``). Timings on a shared machine are noisy; both
commands measure their contenders in one run, side by side.
"""
