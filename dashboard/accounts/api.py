"""POST /api/tokens/: a script or `trainyard login` trades a username and password for a new
API token (the key in the answer, once)."""

from __future__ import annotations

from django.contrib.auth import authenticate
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from dashboard.accounts.services import token_create
from dashboard.api import ApiError, error_response, json_body

LOGIN_REQUIRED = "login required: POST a JSON object with username and password"


@csrf_exempt  # no session is used: the password in the body is the credential
@login_not_required
def tokens_create(request: HttpRequest) -> JsonResponse:
    # Like every API route, an anonymous caller learns nothing, not even which methods it takes.
    if request.method != "POST":
        if not request.user.is_authenticated:
            return error_response(401, LOGIN_REQUIRED)
        return error_response(405, "method not allowed; use POST", headers={"Allow": "POST"})
    try:
        payload = json_body(request)
    except ApiError as exc:
        # Without readable credentials the caller is not logged in; the reason comes along.
        status = exc.status if exc.status == 413 else 401
        return error_response(status, f"{LOGIN_REQUIRED} ({exc.message})")
    username, password, name = (payload.get(k) for k in ("username", "password", "name"))
    if not (isinstance(username, str) and isinstance(password, str) and username and password):
        return error_response(401, LOGIN_REQUIRED)
    if name is not None and not isinstance(name, str):
        return error_response(400, "invalid request", {"name": ["must be a string"]})
    user = authenticate(request, username=username, password=password)
    if user is None or not user.is_active:
        return error_response(401, "login failed: wrong username or password")
    token, key = token_create(user=user, name=name or "")
    body = {"id": token.pk, "name": token.name, "prefix": token.prefix, "token": key}
    return JsonResponse(body, status=201, headers={"Cache-Control": "no-store"})
