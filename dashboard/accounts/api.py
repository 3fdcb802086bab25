"""POST /api/tokens/: a script or `trainyard login` trades a username and password for a new
API token (the key in the answer, once)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import authenticate
from django.http import HttpRequest, JsonResponse
from ninja import Router, Schema
from pydantic import ConfigDict, Field

from dashboard.accounts.services import (
    EXPIRY_MAX_DAYS,
    TokenRateLimited,
    token_create_limited,
    token_expiry,
)
from dashboard.accounts.throttles import LoginThrottled
from dashboard.api import ApiError, error_response, errors, json_body, json_request_body

LOGIN_REQUIRED = "login required: POST a JSON object with username and password"
EXPIRY_DAYS = f"must be a whole number of days from 1 to {EXPIRY_MAX_DAYS}, or null"

router = Router(tags=["tokens"])


class TokenIn(Schema):
    model_config = ConfigDict(extra="allow")

    username: str
    password: str
    name: str | None = Field(None, description="to tell your tokens apart on the tokens page")
    expires_in_days: int | None = Field(
        None,
        ge=1,
        le=EXPIRY_MAX_DAYS,
        description="the token stops working this many days from now (none: when revoked)",
    )


class TokenOut(Schema):
    id: int
    name: str
    prefix: str
    token: str = Field(description="the key, shown this once: send it as `Bearer <key>`")
    expires_at: str | None = Field(description="ISO 8601; null: it works until revoked")


@router.post(
    "/tokens/",
    url_name="api-tokens",
    auth=None,  # no session or token: the password in the body is the credential
    response={201: TokenOut, **errors(400, 413, 429)},
    openapi_extra={"security": []}
    | json_request_body(TokenIn, description="the account's username and password"),
)
def tokens_create(request: HttpRequest) -> JsonResponse:
    """Trade a username and password for a new API token."""
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
    days = payload.get("expires_in_days")
    if days is not None and not _days_valid(days):
        return error_response(400, "invalid request", {"expires_in_days": [EXPIRY_DAYS]})
    try:
        user = authenticate(request, username=username, password=password)
    except LoginThrottled as throttled:  # too many wrong passwords: this one is not checked
        return error_response(
            429,
            throttled.message,
            details=throttled.as_details(),
            headers={"Retry-After": str(throttled.retry_after)},
        )
    if user is None or not user.is_active:
        return error_response(401, "login failed: wrong username or password")
    try:
        token, key = token_create_limited(
            user=user, name=name or "", expires_at=token_expiry(days=days)
        )
    except TokenRateLimited as refused:
        return error_response(
            429,
            refused.message,
            details={"limit": "token_rate", "retry_after": refused.retry_after},
            headers={"Retry-After": str(refused.retry_after)},
        )
    expires_at = token.expires_at.isoformat() if token.expires_at else None
    body = {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "token": key,
        "expires_at": expires_at,
    }
    return JsonResponse(body, status=201, headers={"Cache-Control": "no-store"})


def _days_valid(days: Any) -> bool:
    # bool is an int to Python, not a number of days to anyone.
    return type(days) is int and 1 <= days <= EXPIRY_MAX_DAYS
