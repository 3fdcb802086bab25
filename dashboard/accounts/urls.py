from django.urls import path

from dashboard.accounts import api, views

urlpatterns = [
    path("tokens/", views.token_list, name="token-list"),
    path("tokens/<int:pk>/revoke/", views.token_revoke_view, name="token-revoke"),
]

api_urlpatterns = [
    path("", api.tokens_create, name="api-tokens"),
]
