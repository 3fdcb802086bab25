"""The JSON API, as the server documents it (docs/reference/api.md; the schema at /api/schema/)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import requests

TIMEOUT_SECONDS = 30


class ApiError(Exception):
    """A refusal of the server (its status and its words) or no answer at all (status 0)."""

    def __init__(self, status: int, message: str, errors: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or {}

    def lines(self) -> list[str]:
        """The server's message, then one line per field and reason, as the form shows them."""
        out = [self.message]
        for field, reasons in self.errors.items():
            out.extend(f"  {field}: {reason}" for reason in reasons)
        return out


def _error_of(response: requests.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        errors = body.get("errors") if isinstance(body.get("errors"), dict) else None
        message = body["error"]
        if "retry_after" in body:
            message += f" (retry after {body['retry_after']} s)"
        return ApiError(response.status_code, message, errors)
    return ApiError(response.status_code, f"HTTP {response.status_code} from {response.url}")


class Api:
    def __init__(self, *, url: str, token: str):
        self.url = url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers["User-Agent"] = "trainyard-cli"

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        timeout: float = TIMEOUT_SECONDS,
        files: Any = None,
    ) -> Any:
        """One call; `files` (requests' multipart files) for an upload."""
        try:
            response = self.session.request(
                method, self.url + path, json=json, files=files, timeout=timeout,
                allow_redirects=False,
            )  # fmt: skip
        except requests.RequestException as exc:
            raise ApiError(0, f"cannot reach {self.url}: {exc}") from None
        if not 200 <= response.status_code < 300:
            raise _error_of(response)
        try:
            return response.json()
        except ValueError:
            raise ApiError(response.status_code, f"not JSON from {response.url}") from None

    def experiments(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/api/experiments/")["experiments"])

    def experiment(self, pk: int) -> dict[str, Any]:
        return dict(self.request("GET", f"/api/experiments/{pk}/"))

    def launch(self, fields: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", "/api/experiments/", json=fields))

    def stop(self, pk: int) -> dict[str, Any]:
        return dict(self.request("POST", f"/api/experiments/{pk}/stop/"))

    def metrics(self, pk: int) -> list[dict[str, Any]]:
        """Every raw point of the run (the API pages them): one row a step, a column a series."""
        rows: dict[int, dict[str, Any]] = {}
        path: str | None = f"/api/experiments/{pk}/metrics/?raw=1"
        while path:
            page = self.request("GET", path)
            for key, points in page["series"].items():
                for step, time, value in points:
                    rows.setdefault(step, {"step": step, "time": time})[key] = value
            following = urlsplit(page["next"]) if page["next"] else None
            path = f"{following.path}?{following.query}" if following else None
        return [rows[step] for step in sorted(rows)]


def token_create(*, url: str, username: str, password: str, name: str) -> str:
    """A new token for this user (the server keeps only its hash)."""
    try:
        response = requests.post(
            url + "/api/tokens/",
            json={"username": username, "password": password, "name": name},
            timeout=TIMEOUT_SECONDS,
            allow_redirects=False,
        )
    except requests.RequestException as exc:
        raise ApiError(0, f"cannot reach {url}: {exc}") from None
    if response.status_code != 201:
        raise _error_of(response)
    return str(response.json()["token"])
