from django.urls import path

from dashboard.notifications import views

urlpatterns = [
    path("", views.notification_settings, name="notification-settings"),
    path("secret/", views.webhook_secret_renew, name="notification-secret"),
]
