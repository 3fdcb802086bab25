from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", include("dashboard.api_urls")),
    path("devices/", include("dashboard.devices.urls")),
    path("", include("dashboard.experiments.urls")),
]
