"""The JSON API under /api/: one NinjaAPI made of each app's Router, so that /api/schema/ lists
every route (dashboard/api.py has the plumbing: auth, errors, the docs page)."""

from dashboard.accounts import api as accounts_api
from dashboard.api import api_build
from dashboard.devices import views as device_views
from dashboard.experiments.web import api as experiment_api
from dashboard.experiments.web import (
    api_code,
    api_compare,
    api_exports,
    api_profiles,
    api_queue,
    api_report,
)
from dashboard.studies import api as studies_api

api = api_build(
    [
        accounts_api.router,
        device_views.router,
        api_code.router,
        api_compare.router,
        api_exports.router,
        experiment_api.router,
        api_queue.router,
        api_profiles.router,
        api_report.router,
        studies_api.router,
    ]
)
urlpatterns = api.urls[0]
