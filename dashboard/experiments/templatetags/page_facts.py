"""``{% page_facts %}``: the facts every page script reads, sent once in the page as JSON.

The strategies come from training/registry.py, the status labels from the model's choices,
which statuses are final from transitions.py, the socket's close codes from messages.py, the
charts from metrics/series_contract.py and the phases from metrics/phases.py, so static/js keeps
no copy of any of them (static/js/common.js reads them as ``Trainyard.facts``).
"""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import json_script
from django.utils.safestring import SafeString

from dashboard.experiments.core.forms import FORM_STRATEGIES
from dashboard.experiments.core.messages import SocketClose
from dashboard.experiments.core.transitions import ENDS
from dashboard.experiments.metrics.phases import phase_facts
from dashboard.experiments.metrics.series_contract import series_contract_facts
from dashboard.experiments.models import ACTIVE_STATUSES, Status
from training.registry import REGISTRY

register = template.Library()

PAGE_FACTS_ID = "page-facts"


def page_facts_build() -> dict[str, Any]:
    return {
        "strategies": {
            spec.name: {
                "label": spec.label,
                "short": spec.short,
                "processes": spec.processes,
                "torchrun": spec.torchrun,
                "nodes": spec.nodes,  # can span several machines
                "cpu_only": spec.cpu_only,
                "min_gpus": spec.min_gpus,
                "max_gpus": spec.max_gpus,
                # The options it reads (the launch form shows their fields for it alone).
                "options": [option.name for option in spec.options],
                # The launch form offers it to everyone; a user's own script (user_script) only
                # to those allowed to run one, in place of the engine's model, data and training.
                "form": spec.name in FORM_STRATEGIES,
                "user_script": spec.user_script,
            }
            for spec in REGISTRY
        },
        "statuses": dict(Status.choices),
        "active_statuses": [str(status) for status in ACTIVE_STATUSES],
        # Statuses no transition leaves: the page stops listening there.
        "final_statuses": [status for status in Status.values if status in ENDS],
        # The run socket's close codes, by name (common.js runSocket reads them).
        "socket_close": {code.name.lower(): int(code) for code in SocketClose},
        # Which series key each figure is stored under and which chart draws it (charts.js).
        "series": series_contract_facts(),
        # The phases' labels and colours (static/js/phases.js and the tables' small bars).
        "phases": phase_facts(),
    }


@register.simple_tag
def page_facts() -> SafeString:
    return json_script(page_facts_build(), PAGE_FACTS_ID)
