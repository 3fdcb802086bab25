"""``{% profile_panel experiment as panel %}``: what the run page's profile panel starts from
(core/profiles.py's ``profile_panel``), for templates/experiments/_profiles.html, so that the
page's own view needs no edit to show it."""

from __future__ import annotations

from typing import Any

from django import template

from dashboard.experiments.core.profiles import profile_panel as panel_build
from dashboard.experiments.models import Experiment

register = template.Library()


@register.simple_tag
def profile_panel(experiment: Experiment) -> dict[str, Any]:
    return panel_build(experiment=experiment)
