"""`manage.py k8s_manifest <run id>`: the run as a Kubeflow Trainer TrainJob, in YAML, for an
operator's `kubectl apply -f -` (scheduling/kubernetes/manifest.py; on paper:
docs/guides/kubernetes.md says what is not built)."""

from __future__ import annotations

from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dashboard.experiments.models import Experiment
from dashboard.experiments.scheduling.kubernetes.manifest import trainjob_render


class Command(BaseCommand):
    help = "Print a run's Kubeflow Trainer TrainJob manifest (YAML) for kubectl apply -f -."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("experiment_id", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        run_id = options["experiment_id"]
        experiment = Experiment.objects.filter(pk=run_id).first()
        if experiment is None:
            raise CommandError(f"no run {run_id}")
        # The header says what the file is where it ends up: a comment kubectl ignores.
        self.stdout.write(f"# Trainyard run {run_id} as a TrainJob (docs/guides/kubernetes.md)")
        self.stdout.write(yaml.safe_dump(trainjob_render(experiment=experiment), sort_keys=False))
