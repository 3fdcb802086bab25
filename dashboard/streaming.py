"""Streamed responses that stay streamed under ASGI.

Under ASGI (daphne), Django reads a synchronous iterator of a StreamingHttpResponse whole into
memory before it sends a byte (and warns); an asynchronous one that takes a chunk at a time,
from the thread where the database cursor lives, keeps the memory to one chunk there too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest


def streamed(request: HttpRequest, chunks: Iterator[str]) -> Iterator[str] | AsyncIterator[str]:
    """`chunks` as the server that serves `request` streams them."""
    if not isinstance(request, ASGIRequest):
        return chunks
    return _chunks_async(chunks)


def _chunk_next(chunks: Iterator[str]) -> str | None:
    return next(chunks, None)


async def _chunks_async(chunks: Iterator[str]) -> AsyncIterator[str]:
    # thread_sensitive (the default): every chunk is read in the one thread that opened the
    # cursor, as the synchronous view would.
    take = sync_to_async(_chunk_next)
    while (chunk := await take(chunks)) is not None:
        yield chunk
