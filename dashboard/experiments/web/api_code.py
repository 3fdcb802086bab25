"""POST /api/code/: a folder of the caller's code, as a .tar.gz or .zip, checked and kept once by
its hash (scripts/code.py); the same content again answers the same id. Only those allowed to
run scripts may upload (core/access.py's script_allowed): a script runs arbitrary code as the
worker's user."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router, Schema

from dashboard.api import MAX_BODY_BYTES, ApiError, errors, with_upload_handler
from dashboard.experiments.core.access import script_allowed
from dashboard.experiments.scripts.code import CodeRefused, code_max_bytes, code_store
from dashboard.experiments.web.upload_cap import UploadCap

router = Router(tags=["code"])

CODE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["archive"],
                    "properties": {
                        "archive": {
                            "type": "string",
                            "format": "binary",
                            "description": "the folder as a .tar.gz or a .zip",
                        }
                    },
                }
            }
        },
    }
}
NOT_ALLOWED = (
    "uploading code needs the permission experiments.run_script (a script runs arbitrary code "
    "on the workers): ask an administrator"
)


class CodeOut(Schema):
    id: int
    sha256: str
    bytes: int
    files: int


class CodeCap(UploadCap):
    """Before the body is read (a session's CSRF check reads it before the view runs): a caller
    not allowed to run scripts is refused (403), an archive over the size taken too (413)."""

    slack = MAX_BODY_BYTES  # the multipart's own bytes around the archive

    def limit_get(self) -> int:
        return code_max_bytes()

    def handle_raw_input(self, *args: Any, **kwargs: Any) -> None:
        user = getattr(self.request, "user", None)
        if user is not None and user.is_authenticated and not script_allowed(user=user):
            raise ApiError(403, NOT_ALLOWED)
        super().handle_raw_input(*args, **kwargs)

    def refusal_text(self) -> str:
        return f"the archive is over the {self.limit} bytes taken"


@router.post(
    "/code/",
    url_name="api-code",
    response={201: CodeOut, **errors(400, 403, 413)},
    openapi_extra=CODE_BODY,
)
@with_upload_handler(CodeCap)
def code_upload(request: HttpRequest) -> Any:
    """Upload a folder of code for script runs; answers its id, hash, size and file count."""
    if not script_allowed(user=request.user):
        raise ApiError(403, NOT_ALLOWED)
    upload = request.FILES.get("archive")
    if upload is None:
        message = "send the folder as the multipart field `archive` (.tar.gz or .zip)"
        raise ApiError(400, message, {"archive": ["required"]})
    try:
        code = code_store(owner=request.user, upload=upload, size=upload.size or 0)
    except CodeRefused as refused:
        raise ApiError(refused.status, str(refused)) from None
    body = {"id": code.pk, "sha256": code.sha256, "bytes": code.bytes, "files": code.files}
    return JsonResponse(body, status=201)
