from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "dashboard.notifications"
    label = "notifications"
    verbose_name = "Notifications"
