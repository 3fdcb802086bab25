"""The queue page (/queue/): queued runs in claim order, drawn and refreshed by static/js/queue.js
from GET /api/queue/ (the first answer comes in the page, so it shows without a round trip)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from dashboard.experiments.web.api_queue import queue_listing

# Positions and estimates move when a run starts or ends; a few seconds late is fine on a page.
POLL_SECONDS = 3


def queue_page(request: HttpRequest) -> HttpResponse:
    listing = queue_listing(user=request.user, now=timezone.now())
    context = {
        "listing": listing,
        "poll_seconds": POLL_SECONDS,
    }
    return render(request, "experiments/queue.html", context)
