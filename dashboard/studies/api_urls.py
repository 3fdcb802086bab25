"""/api/studies/... (included from dashboard/api_urls.py)."""

from django.urls import path

from dashboard.studies import api

urlpatterns = [
    path("", api.studies, name="api-studies"),
    path("<int:pk>/", api.study_detail, name="api-study"),
    path("<int:pk>/stop/", api.study_stop_view, name="api-study-stop"),
    path("<int:pk>/export/", api.study_export, name="api-study-export"),
]
