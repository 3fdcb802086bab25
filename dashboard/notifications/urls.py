from django.urls import path

from dashboard.notifications import views

urlpatterns = [
    path("", views.notification_settings, name="notification-settings"),
    path("secret/", views.webhook_secret_renew, name="notification-secret"),
    path("verify/", views.email_verify_send_view, name="notification-email-verify-send"),
    path("verify/<str:token>/", views.email_verify_view, name="notification-email-verify"),
]
