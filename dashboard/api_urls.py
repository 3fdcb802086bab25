"""The JSON API under /api/. A plain list: each app appends its own routes."""

from django.urls import path

from dashboard.devices import views as device_views
from dashboard.experiments import api as experiment_api
from dashboard.experiments import api_compare, api_exports

urlpatterns = [
    path("devices/", device_views.api_devices, name="api-devices"),
    path("experiments/", experiment_api.experiments, name="api-experiments"),
    path("experiments/compare/", api_compare.experiments_compare, name="api-experiments-compare"),
    path("experiments/<int:pk>/", experiment_api.experiment_detail, name="api-experiment"),
    path(
        "experiments/<int:pk>/metrics/",
        experiment_api.experiment_metrics,
        name="api-experiment-metrics",
    ),
    path(
        "experiments/<int:pk>/logs/",
        experiment_api.experiment_logs,
        name="api-experiment-logs",
    ),
    path(
        "experiments/<int:pk>/stop/",
        experiment_api.experiment_stop_view,
        name="api-experiment-stop",
    ),
    path(
        "experiments/<int:pk>/checkpoint/",
        experiment_api.experiment_checkpoint_view,
        name="api-experiment-checkpoint",
    ),
    path(
        "experiments/<int:pk>/checkpoints/",
        experiment_api.experiment_checkpoints,
        name="api-experiment-checkpoints",
    ),
    path(
        "experiments/<int:pk>/checkpoints/<int:step>/",
        experiment_api.experiment_checkpoint_file,
        name="api-experiment-checkpoint-file",
    ),
    path(
        "experiments/<int:pk>/export/",
        api_exports.experiment_export,
        name="api-experiment-export",
    ),
    path("experiments/import/", api_exports.experiment_import_view, name="api-experiments-import"),
    path(
        "experiments/compare/export/",
        api_exports.experiments_compare_export,
        name="api-experiments-compare-export",
    ),
]
