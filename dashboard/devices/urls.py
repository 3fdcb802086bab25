from django.urls import path

from dashboard.devices import views

urlpatterns = [
    path("", views.device_list, name="device-list"),
]
