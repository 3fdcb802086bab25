"""An upload refused by its size before it is read: by its Content-Length, and by the bytes that
really arrive where there is none. Each upload route says its limit and its answer."""

from __future__ import annotations

from typing import Any

from django.core.files.uploadhandler import FileUploadHandler
from django.http import HttpRequest

from dashboard.api import ApiError


class UploadCap(FileUploadHandler):
    status = 413  # the answer to an upload over the limit
    slack = 0  # what a request may carry beyond the file's bytes (its Content-Length)

    def __init__(self, request: HttpRequest | None = None):
        super().__init__(request)
        self.limit = self.limit_get()
        self.received = 0

    def limit_get(self) -> int:
        raise NotImplementedError

    @classmethod
    def body_most(cls) -> int:
        """The largest request body the route takes: daphne's request refuses a larger one by
        its Content-Length before reading it (dashboard/http_server.py), as this handler would
        once it was read."""
        return cls().limit + cls.slack

    def refusal_text(self) -> str:
        return f"the upload is over the limit of {self.limit} bytes"

    def _refuse(self) -> ApiError:
        return ApiError(self.status, self.refusal_text())

    def handle_raw_input(
        self,
        input_data: Any,
        META: dict[str, Any],  # noqa: N803 (Django's name)
        content_length: int,
        boundary: bytes,
        encoding: str | None = None,
    ) -> None:
        if content_length > self.limit + self.slack:
            raise self._refuse()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.received > self.limit:
            raise self._refuse()
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None
