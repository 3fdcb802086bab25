from django.urls import re_path

from dashboard.experiments.web.consumers import ExperimentConsumer

websocket_urlpatterns = [
    re_path(r"^ws/experiments/(?P<pk>\d+)/$", ExperimentConsumer.as_asgi()),
]
