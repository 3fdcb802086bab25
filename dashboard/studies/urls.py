from django.urls import path

from dashboard.studies import views

urlpatterns = [
    path("", views.study_list, name="study-list"),
    path("new/", views.study_new, name="study-new"),
    path("<int:pk>/", views.study_detail, name="study-detail"),
    path("<int:pk>/stop/", views.study_stop_page, name="study-stop"),
]
