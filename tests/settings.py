"""The settings the tests run under: the local dashboard's, asked for with TRAINYARD_DEBUG=1 as
`make run` asks for them (DEBUG is off unless asked for, and then the settings want a real
SECRET_KEY, ALLOWED_HOSTS and HTTPS).

pytest-django imports the settings before any conftest runs, so the variable is set here, in
os.environ: every process a test starts (the stack's daphne, Celery and `manage.py`) inherits it
and loads dashboard.settings itself. A test of the production settings takes it out of its
process's environment (tests/test_access.py's python_run)."""

import os

os.environ.setdefault("TRAINYARD_DEBUG", "1")

from dashboard.settings import *  # noqa: E402, F403

# pytest-django put this module's name in the environment: the processes the tests start load
# the dashboard's own settings (this module is not importable from where Celery starts).
os.environ["DJANGO_SETTINGS_MODULE"] = "dashboard.settings"
