"""Bad input, fuzzed: invalid launch payloads to the JSON API and the form, junk frames to the
WebSocket. Every input is invalid by construction; none may create a run, each gets a clear
refusal, and the server still answers a valid request afterwards."""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboard.accounts.models import ApiToken
from dashboard.api import MAX_BODY_BYTES, json_constant_refuse, json_float_parse
from dashboard.experiments.core.forms import LIMITS, LR_MAX, MAX_GPU_IDS, ExperimentForm
from dashboard.experiments.models import Dataset, Experiment, LogLine, SeriesPoint
from dashboard.experiments.web.api_launch import FIELD_TYPES, NULLABLE_FIELDS
from dashboard.experiments.web.consumers import MAX_CLIENT_FRAME_BYTES, frame_size
from tests.factories import form_data

ROOT = Path(__file__).resolve().parent.parent
# make test runs every fuzzer's examples; make test-fast, the inner loop, a fifth of them
# (TRAINYARD_FUZZ_SHARE=0.2: 11 of its CPU-s), different ones each run, as Hypothesis draws.
SHARE = float(os.environ.get("TRAINYARD_FUZZ_SHARE", "1"))
API_PAYLOADS = max(1, round(1000 * SHARE))
SOCKET_FRAMES = max(1, round(1000 * SHARE))
FORM_POSTS = max(1, round(300 * SHARE))
ORIGIN = (b"origin", b"http://localhost")
# No machine has GPU 1000: an id from here up never exists, on this machine or a GPU runner.
ABSENT_GPU = 1000
FUZZ = settings(
    deadline=None,
    database=None,  # no .hypothesis folder in the repository
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
VALID_FORM = form_data()


def choices_of(field: str) -> list[Any]:
    return [value for value, _ in Experiment._meta.get_field(field).choices or []]


CHOICE_FIELDS = [f for f in FIELD_TYPES if f not in LIMITS and choices_of(f)]
# Choices whose empty value is a valid one, their default (core/backends.py: the form's blank
# backend and the API's "" alike); any other text outside the choices is refused.
BLANK_IS_DEFAULT = {"backend"}

# --- JSON payloads, invalid by construction ----------------------------------------------------

# Text a column can hold: a NUL or a lone surrogate anywhere in a body is refused for that alone
# (dashboard/text_input.py), which would hide the field a case plants; out_of_range plants them.
storable = st.characters(exclude_characters="\x00", exclude_categories=("Cs",))
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(storable, max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(storable, max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
# Valid values for the other fields, so that the invalid one is not alone. Strategy, processes
# and GPUs stay out: which of their combinations fit depends on the machine.
valid_base = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(
            alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40
        ),
        # The built-ins: the column takes any name a worker reports (the launch checks judge).
        "dataset": st.sampled_from(list(Dataset.values)),
        "epochs": st.integers(1, 3),
        "batch_size": st.integers(1, 256),
        "lr": st.floats(1e-4, 1.0),
        "optimizer": st.sampled_from(choices_of("optimizer")),
        "seed": st.integers(0, 1000),
    },
)


def is_wrong_type(field: str, value: Any) -> bool:
    if value is None:
        return field not in NULLABLE_FIELDS
    # Booleans are never numbers; only a switch's field takes them (and only them).
    wants_bool = FIELD_TYPES[field] == (bool,)
    return isinstance(value, bool) != wants_bool or not isinstance(value, FIELD_TYPES[field])


@st.composite
def wrong_types(draw: Any) -> tuple[dict[str, Any], str]:
    field = draw(st.sampled_from(sorted(FIELD_TYPES)))
    return {field: draw(json_values.filter(lambda v: is_wrong_type(field, v)))}, field


def out_of_limits(field: str) -> Any:
    low, high = LIMITS[field]
    return (
        st.integers(max_value=low - 1)
        | st.integers(min_value=high + 1)
        | st.integers(2**63, 2**300)
    )


@st.composite
def out_of_range(draw: Any) -> tuple[dict[str, Any], str]:
    fields = sorted(LIMITS) + ["lr", "name", "gpus"] + CHOICE_FIELDS
    field = draw(st.sampled_from(fields))
    if field in LIMITS:
        value: Any = draw(out_of_limits(field))
    elif field == "lr":
        value = draw(
            st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)
            | st.floats(min_value=LR_MAX, exclude_min=True, allow_nan=False, allow_infinity=False)
            | st.integers(max_value=0)
            | st.integers(min_value=int(LR_MAX) + 1)
        )
    elif field == "name":
        value = draw(
            st.text(min_size=201, max_size=300)
            | st.text(max_size=20).map(lambda t: t + "\x00")
            | st.text(max_size=20).map(lambda t: t + "\udc80")  # a lone surrogate
        )
    elif field == "gpus":
        value = draw(bad_gpu_lists)
    else:  # a choice: strategy, dataset, optimizer, zero_stage, ...
        known = choices_of(field)
        kind = FIELD_TYPES[field][0]
        pool = st.integers() if kind is int else st.text(max_size=30)
        blank = {""} if field in BLANK_IS_DEFAULT else set()
        value = draw(pool.filter(lambda v: v not in known and v not in blank))
    return {field: value}, field


bad_gpu_lists = (
    st.lists(st.integers(max_value=-1), min_size=1, max_size=4)  # negative
    | st.integers(0, 7).map(lambda i: [i, i])  # twice
    | st.integers(MAX_GPU_IDS + 1, 4 * MAX_GPU_IDS).map(lambda n: list(range(n)))  # too many
    | st.lists(st.integers(ABSENT_GPU, 10**6), min_size=1, max_size=3, unique=True)  # absent
    | st.lists(st.integers(2**63, 2**200), min_size=1, max_size=2)  # out of any range
)


@st.composite
def unknown_fields(draw: Any) -> tuple[dict[str, Any], str]:
    extra = draw(
        st.dictionaries(
            st.text(storable, max_size=30).filter(lambda k: k not in FIELD_TYPES),
            json_values,
            min_size=1,
            max_size=3,
        )
    )
    return extra, sorted(extra)[0]


def as_body(case: tuple[dict[str, Any], str], base: dict[str, Any]) -> tuple[bytes, str]:
    planted, field = case
    return json.dumps({**base, **planted}).encode(), field


def parses_to_object(body: bytes) -> bool:
    """What the server would take as a payload: junk must never be one."""
    try:
        data = json.loads(body, parse_constant=json_constant_refuse, parse_float=json_float_parse)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict)


def oversized(size: int) -> bytes:
    return b'{"name": "' + b"x" * size + b'"}'


junk_bodies = st.one_of(
    st.binary(min_size=1, max_size=200).filter(lambda b: not parses_to_object(b)),
    st.text(min_size=1, max_size=200).map(str.encode).filter(lambda b: not parses_to_object(b)),
    json_values.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    st.tuples(
        st.sampled_from(sorted(FIELD_TYPES)),
        st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]),
    ).map(lambda t: f'{{"{t[0]}": {t[1]}}}'.encode()),
    st.integers(500, 40_000).map(lambda n: b'{"gpus": ' + b"[" * n + b"]" * n + b"}"),
    st.integers(4_400, 20_000).map(lambda n: b'{"seed": ' + b"9" * n + b"}"),
    st.integers(MAX_BODY_BYTES, 4 * MAX_BODY_BYTES).map(oversized),
)
content_types = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/octet-stream",
    ]
)
api_cases = st.one_of(
    st.tuples(st.one_of(wrong_types(), out_of_range(), unknown_fields()), valid_base).map(
        lambda t: as_body(t[0], t[1])
    ),
    junk_bodies.map(lambda body: (body, "")),
)


def refusal_check(response: Any, *, field: str) -> None:
    """A 4xx JSON answer that names the field, or for junk says what is wrong."""
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    assert response["Content-Type"] == "application/json", response["Content-Type"]
    body = response.json()
    assert isinstance(body["error"], str) and body["error"], body
    if field:
        assert field in body.get("errors", {}), (field, body)
        assert body["errors"][field][0], body


@pytest.mark.django_db
def test_api_refuses_invalid_payloads(
    user_factory: Any, launched: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    token = ApiToken.objects.create(user=user_factory(username="fuzzer"))
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token.key}")
    stats: Counter[str] = Counter()

    @settings(FUZZ, max_examples=API_PAYLOADS)
    @given(case=api_cases, content_type=content_types)
    def send(case: tuple[bytes, str], content_type: str) -> None:
        body, field = case
        response = client.post("/api/experiments/", body, content_type=content_type)
        stats["sent"] += 1
        stats["accepted"] += response.status_code < 400
        stats[f"status {response.status_code}"] += 1
        refusal_check(response, field=field)
        assert not Experiment.objects.exists() and not launched

    send()
    with capsys.disabled():
        print(
            f"\nAPI fuzz: {stats['sent']} invalid payloads sent, {stats['accepted']} accepted; "
            f"{dict(stats)}"
        )
    assert stats["sent"] >= API_PAYLOADS and stats["accepted"] == 0
    # The server still takes a valid launch.
    response = client.post(
        "/api/experiments/", {"strategy": "single"}, content_type="application/json"
    )
    assert response.status_code == 201, response.content
    assert Experiment.objects.count() == 1


# --- the launch form ---------------------------------------------------------------------------

letters = st.text(alphabet=st.characters(categories=["L"]), min_size=1, max_size=20)
fractions = st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())


def bad_form_value(field: str) -> Any:
    if field in LIMITS:
        low, high = LIMITS[field]
        numbers = st.integers(max_value=low - 1) | st.integers(min_value=high + 1)
        return letters | fractions.map(repr) | numbers.map(str)
    if field == "lr":
        return letters | st.sampled_from(["nan", "inf", "-inf", "1e999", "0", "-0.5", "10.5"])
    if field == "gpus":
        return letters | st.sampled_from(
            [
                "-1",
                "0,0",
                "1.5",
                "²",
                "٣,x",
                "9" * 5000,
                ",".join(map(str, range(MAX_GPU_IDS + 1))),
                str(ABSENT_GPU),
            ]
        )
    if field == "name":
        # Too long once the form strips it (Django's CharField strips whitespace first: 200
        # zeros and a "\r" is a valid name).
        too_long = st.text(min_size=201, max_size=300).filter(lambda t: len(t.strip()) > 200)
        return too_long | letters.map(lambda t: t + "\x00")
    known = {str(value) for value in choices_of(field)}
    return (letters | st.integers().map(str)).filter(lambda v: v not in known)


FORM_FIELDS = sorted(set(LIMITS) | {"lr", "gpus", "name"} | set(CHOICE_FIELDS))
form_cases = st.one_of(
    st.sampled_from(FORM_FIELDS)
    .flatmap(lambda f: st.tuples(st.just(f), bad_form_value(f)))
    .map(lambda t: ({t[0]: t[1]}, t[0])),
    st.dictionaries(
        # Not a field's name: "compile" or "precision" are letters only, and fields.
        letters.filter(
            lambda k: (
                k not in VALID_FORM
                and k not in FIELD_TYPES
                and k not in {"clone", "csrfmiddlewaretoken"}
            )
        ),
        letters,
        min_size=1,
        max_size=3,
    ).map(lambda extra: (extra, "__all__")),
)


@pytest.mark.django_db
def test_form_refuses_invalid_posts(user_factory: Any, launched: list[int]) -> None:
    client = Client()
    client.force_login(user_factory())
    stats: Counter[str] = Counter()

    @settings(FUZZ, max_examples=FORM_POSTS)
    @given(case=form_cases)
    def send(case: tuple[dict[str, str], str]) -> None:
        changes, field = case
        response = client.post("/experiments/new/", {**VALID_FORM, **changes})
        stats["sent"] += 1
        assert response.status_code == 400, (changes, response.status_code)
        form = response.context["form"]
        assert isinstance(form, ExperimentForm) and field in form.errors, (changes, form.errors)
        assert not Experiment.objects.exists() and not launched

    send()
    assert stats["sent"] >= FORM_POSTS
    assert client.post("/experiments/new/", VALID_FORM).status_code == 302


# --- WebSocket frames --------------------------------------------------------------------------

commands = st.fixed_dictionaries(
    {"type": st.sampled_from(["stop", "launch", "snapshot", "subscribe", "run.events", "ping"])},
    optional={
        "pk": st.integers(),
        "experiment": st.integers(),
        "events": st.lists(
            st.dictionaries(st.text(max_size=5), st.integers(), max_size=3), max_size=3
        ),
    },
)
launch_requests = st.fixed_dictionaries(
    {"strategy": st.sampled_from(["single", "ddp"])}, optional={"epochs": st.integers(1, 3)}
)
over = MAX_CLIENT_FRAME_BYTES + 1
frames = st.one_of(
    st.text(max_size=200).map(lambda t: ("text", t)),
    st.binary(max_size=300).map(lambda b: ("bytes", b)),
    (commands | launch_requests).map(lambda d: ("text", json.dumps(d))),
    json_values.map(lambda v: ("text", json.dumps(v))),
    st.tuples(st.characters(codec="utf-8"), st.integers(over, 100_000)).map(
        lambda t: ("text", t[0] * t[1])
    ),
    st.integers(over, 100_000).map(lambda n: ("bytes", b"\x00" * n)),
)


class SocketFuzzer:
    """One connection reused frame after frame; a fresh one after the server closes it."""

    def __init__(self, *, pk: int, user: Any) -> None:
        self.pk, self.user = pk, user
        self.comm: WebsocketCommunicator | None = None
        self.stats: Counter[str] = Counter()

    async def connect(self) -> WebsocketCommunicator:
        from dashboard.asgi import application

        comm = WebsocketCommunicator(application, f"/ws/experiments/{self.pk}/", headers=[ORIGIN])
        comm.scope["user"] = self.user
        connected, _ = await comm.connect()
        assert connected, "a fresh connection must still work"
        assert (await comm.receive_json_from())["type"] == "snapshot"
        self.stats["connections"] += 1
        return comm

    async def send(self, kind: str, data: Any) -> None:
        if self.comm is None:
            self.comm = await self.connect()
        comm = self.comm
        # send_input, not send_to: send_to refuses empty frames, which a client can send.
        await comm.send_input({"type": "websocket.receive", kind: data})
        self.stats["sent"] += 1
        output = await comm.receive_output(timeout=5)
        size = frame_size(
            text_data=data if kind == "text" else None, bytes_data=data if kind == "bytes" else None
        )
        if output["type"] == "websocket.close":
            self.stats["closed"] += 1
            assert size > MAX_CLIENT_FRAME_BYTES and output.get("code") == 1009, (size, output)
            await comm.disconnect()
            self.comm = None
            return
        reply = json.loads(output["text"])
        if reply.get("type") == "error" and reply.get("error"):
            self.stats["refused"] += 1
        else:
            self.stats["accepted"] += 1
        assert size <= MAX_CLIENT_FRAME_BYTES and reply["type"] == "error", (size, reply)

    async def close(self) -> None:
        if self.comm is not None:
            await self.comm.disconnect()
            self.comm = None


def loop_shutdown(loop: asyncio.AbstractEventLoop) -> None:
    # After a failed example a consumer may still wait on the channel layer: end it quietly.
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


@pytest.mark.django_db(transaction=True)
def test_socket_refuses_junk_frames(
    user_factory: Any, experiment_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    owner = user_factory()
    run = experiment_factory(owner=owner)
    fuzzer = SocketFuzzer(pk=run.pk, user=owner)
    # One event loop for every example, so that a connection outlives a frame.
    loop = asyncio.new_event_loop()
    try:

        @settings(FUZZ, max_examples=SOCKET_FRAMES)
        @given(frame=frames)
        def send(frame: tuple[str, Any]) -> None:
            loop.run_until_complete(fuzzer.send(*frame))

        send()
        loop.run_until_complete(fuzzer.close())
        # A fresh connection still gets its snapshot.
        loop.run_until_complete(SocketFuzzer(pk=run.pk, user=owner).connect())
    finally:
        loop_shutdown(loop)
    stats = fuzzer.stats
    with capsys.disabled():
        print(
            f"\nWebSocket fuzz: {stats['sent']} junk frames sent, {stats['accepted']} accepted "
            f"({stats['refused']} answered with an error, {stats['closed']} closed the connection "
            f"as too big; {stats['connections']} connections)"
        )
    assert stats["sent"] >= SOCKET_FRAMES and stats["accepted"] == 0
    run.refresh_from_db()
    assert run.status == "queued" and Experiment.objects.count() == 1
    assert not SeriesPoint.objects.exists() and not LogLine.objects.exists()


# --- fixed cases: each was a 500 or a silent acceptance before ---------------------------------


@pytest.fixture
def api_client(user_factory: Any) -> Client:
    client = Client()
    client.force_login(user_factory())
    return client


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "why"),
    [
        ('{"lr": NaN}', "NaN"),
        ('{"lr": Infinity}', "Infinity"),
        ('{"lr": -Infinity}', "Infinity"),
        ('{"lr": 1e999}', "out of range"),
        ('{"seed": ' + "9" * 5000 + "}", "valid JSON"),
        ('{"gpus": ' + "[" * 100_00 + "]" * 100_00 + "}", "JSON"),
    ],
)
def test_json_that_python_reads_but_json_does_not_have(
    api_client: Client, launched: list[int], body: str, why: str
) -> None:
    response = api_client.post("/api/experiments/", body, content_type="application/json")
    assert response.status_code in {400, 413} and why in response.json()["error"]
    assert not Experiment.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"lr": 10**400}, "lr"),  # was an OverflowError in float()
        ({"seed": 2**70}, "seed"),
        ({"name": "x" * 201}, "name"),
        ({"strategy": "y" * 10_000}, "strategy"),
        ({"gpus": [-1]}, "gpus"),
        ({"gpus": [1, 1]}, "gpus"),
        ({"gpus": list(range(MAX_GPU_IDS + 1))}, "gpus"),
        ({"gpus": [ABSENT_GPU]}, "gpus"),
        ({"strategy": "ddp", "processes": None, "gpus": [ABSENT_GPU, ABSENT_GPU + 1]}, "gpus"),
    ],
)
def test_payloads_that_once_slipped_through(
    api_client: Client, launched: list[int], payload: dict[str, Any], field: str
) -> None:
    response = api_client.post("/api/experiments/", payload, content_type="application/json")
    refusal_check(response, field=field)
    assert not Experiment.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("gpus", ["²", "9" * 5000, "٣", ",".join(map(str, range(MAX_GPU_IDS + 1)))])
def test_form_gpu_ids_are_ascii_and_few(user_factory: Any, gpus: str) -> None:
    client = Client()
    client.force_login(user_factory())
    response = client.post("/experiments/new/", {**VALID_FORM, "gpus": gpus})
    assert response.status_code == 400 and "gpus" in response.context["form"].errors


@pytest.mark.django_db
def test_form_refuses_unknown_fields(user_factory: Any) -> None:
    client = Client()
    client.force_login(user_factory())
    response = client.post("/experiments/new/", {**VALID_FORM, "colour": "blue"})
    assert response.status_code == 400 and "colour" in response.content.decode()
    assert not Experiment.objects.exists()


@pytest.mark.django_db
def test_oversized_bodies_get_413_json_everywhere(api_client: Client) -> None:
    big = oversized(MAX_BODY_BYTES)
    for content_type in ("application/json", "application/x-www-form-urlencoded"):
        response = api_client.post("/api/experiments/", big, content_type=content_type)
        assert response.status_code == 413 and str(MAX_BODY_BYTES) in response.json()["error"]


def test_body_and_frame_limits_agree() -> None:
    assert django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE == MAX_BODY_BYTES
    assert django_settings.DAPHNE_WEBSOCKET_MAX_FRAME_SIZE >= MAX_CLIENT_FRAME_BYTES
    assert django_settings.DAPHNE_WEBSOCKET_MAX_MESSAGE_SIZE >= MAX_CLIENT_FRAME_BYTES
    procfile = (ROOT / "Procfile").read_text()
    assert "--websocket-max-frame-size" in procfile and "--websocket-max-message-size" in procfile


@pytest.mark.django_db(transaction=True)
async def test_socket_closes_on_an_oversized_frame_and_refuses_absurd_ids(
    user_factory: Any, experiment_factory: Any
) -> None:
    from asgiref.sync import sync_to_async

    from dashboard.asgi import application

    owner = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=owner)
    comm = WebsocketCommunicator(application, f"/ws/experiments/{run.pk}/", headers=[ORIGIN])
    comm.scope["user"] = owner
    assert (await comm.connect())[0]
    await comm.receive_json_from()
    await comm.send_to(text_data="x" * (MAX_CLIENT_FRAME_BYTES + 1))
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 1009}
    await comm.disconnect()
    for pk in ("9" * 30, "9" * 5000):
        comm = WebsocketCommunicator(application, f"/ws/experiments/{pk}/", headers=[ORIGIN])
        comm.scope["user"] = owner
        assert not (await comm.connect())[0]
        await comm.disconnect()


def test_json_hooks_refuse_what_json_has_not() -> None:
    with pytest.raises(ValueError, match="NaN"):
        json.loads("NaN", parse_constant=json_constant_refuse)
    with pytest.raises(ValueError, match="out of range"):
        json_float_parse("1e999")
    assert math.isclose(json_float_parse("0.5"), 0.5)
