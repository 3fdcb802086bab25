"""Loaded first by the fork server of the bounded children (experiments/core/bounded.py):
Django set up once there, so that the targets' modules, which import models, load in the server
and every child forks ready. Nothing else imports it."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django.setup()
