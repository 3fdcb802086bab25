from django.urls import path

from dashboard.accounts import views

urlpatterns = [
    path("tokens/", views.token_list, name="token-list"),
    path("tokens/<int:pk>/revoke/", views.token_revoke_view, name="token-revoke"),
]
