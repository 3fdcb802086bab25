from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "dashboard.accounts"
    label = "accounts"
    verbose_name = "API tokens"
