from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from dashboard.accounts import urls as accounts_urls
from dashboard.accounts.views import PasswordChangeView

# Of django.contrib.auth.urls only what a signed-in dashboard needs: the password reset views
# answer anonymous visitors and send mail, and Trainyard configures no mail (staff reset
# passwords in the admin).
account_urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Django's, with the choice to revoke the API tokens too.
    path("password_change/", PasswordChangeView.as_view(), name="password_change"),
    path(
        "password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
]

# The admin says whose it is (templates/admin/base_site.html adds the dashboard's icon).
admin.site.site_header = "Trainyard administration"
admin.site.site_title = "Trainyard admin"
admin.site.index_title = "Runs, studies, devices and users"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include(account_urlpatterns)),
    path("accounts/", include(accounts_urls.urlpatterns)),
    path("notifications/", include("dashboard.notifications.urls")),
    path("api/", include("dashboard.api_urls")),
    path("studies/", include("dashboard.studies.urls")),
    path("devices/", include("dashboard.devices.urls")),
    path("", include("dashboard.experiments.urls")),
]
