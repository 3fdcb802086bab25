"""Runs of users' own scripts: the code they upload (``code.py``), kept once by its hash and
checked before it is kept."""
