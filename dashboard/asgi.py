"""ASGI entry point: `daphne dashboard.asgi:application`. HTTP goes to Django, /ws/ to Channels."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

from django.core.asgi import get_asgi_application  # noqa: E402

# Django must be set up before anything imports models, consumers included.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from dashboard import http_server  # noqa: E402
from dashboard.accounts.ws_auth import TokenAuthMiddleware  # noqa: E402
from dashboard.experiments.routing import websocket_urlpatterns  # noqa: E402

# daphne's refusals under /api/ in the API's JSON, and Twisted's multipart parsing off.
http_server.install()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            # Session cookie first, then a bearer token (scripts) overrides it when present.
            AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
        ),
    }
)
