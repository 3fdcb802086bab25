from django.urls import path

from dashboard.experiments.web import views, views_queue

urlpatterns = [
    path("", views.experiment_list, name="experiment-list"),
    path("experiments/new/", views.experiment_new, name="experiment-new"),
    path("queue/", views_queue.queue_page, name="queue"),
    path("experiments/compare/", views.experiment_compare, name="experiment-compare"),
    path("experiments/<int:pk>/", views.experiment_detail, name="experiment-detail"),
    path(
        "experiments/<int:pk>/checkpoints/<int:step>/",
        views.experiment_checkpoint_download,
        name="experiment-checkpoint",
    ),
    path("experiments/<int:pk>/code/", views.experiment_code_download, name="experiment-code"),
]
