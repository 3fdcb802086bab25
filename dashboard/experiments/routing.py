from django.urls import re_path

from dashboard.experiments.core.messages import SOCKET_ROUTE
from dashboard.experiments.web.consumers import ExperimentConsumer

websocket_urlpatterns = [
    re_path(SOCKET_ROUTE, ExperimentConsumer.as_asgi()),
]
