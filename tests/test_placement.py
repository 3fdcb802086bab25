"""Placement: `nodes` and `machines` at launch (refusals say what there is), and the claim of
N machines, all or nothing, on the real database (claim.experiment_claim).

The Celery side (per-machine queues, two real workers, runs launched in the same second) is
tests/test_placement_workers.py.
"""

from __future__ import annotations

import json
import socket
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import close_old_connections
from django.test import Client
from django.utils import timezone

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.core.descriptions import experiment_devices_label
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.claim import experiment_claim
from dashboard.experiments.scheduling.allocation import Machine, rdzv_port_pick, rdzv_ports
from training.registry import REGISTRY

pytestmark = pytest.mark.django_db

HOST_A = Machine("host-a", 2, frozenset())
HOST_B = Machine("host-b", 2, frozenset())


def machine_row(name: str, *, cpus: int = 2, gpus: int = 0, address: str = "") -> WorkerMachine:
    report = {"cpu_count": cpus, "gpus": [{"index": i} for i in range(gpus)]}
    return WorkerMachine.objects.create(
        hostname=name, report=report, reported_at=timezone.now(), address=address
    )


def post(client: Client, body: dict[str, Any]) -> Any:
    return client.post("/api/experiments/", json.dumps(body), content_type="application/json")


@pytest.fixture
def alice(user_factory: Any) -> Client:
    client = Client()
    client.force_login(user_factory(username="alice"))
    return client


@pytest.fixture
def two_hosts() -> None:
    machine_row("host-a", address="10.0.0.1")
    machine_row("host-b", address="10.0.0.2")


# --- launch: fields, refusals with what there is ---


def test_nodes_and_pinned_machines_are_stored_and_read_back(
    alice: Client, two_hosts: None, launched: list[int]
) -> None:
    body = post(alice, {"strategy": "ddp", "processes": 1, "machines": ["host-b", "host-a"]})
    assert body.status_code == 201, body.content
    run = body.json()
    # Nodes follow the pinned machines when omitted; the order is kept (host-b is node 0).
    assert run["nodes"] == 2 and run["machines"] == ["host-b", "host-a"]
    assert run["placement"] == []  # not placed until claimed
    again = alice.get(f"/api/experiments/{run['id']}/").json()
    assert (again["nodes"], again["machines"]) == (2, ["host-b", "host-a"])


def test_one_machine_is_the_default(alice: Client, two_hosts: None, launched: list[int]) -> None:
    response = post(alice, {"strategy": "ddp", "processes": 2})
    assert response.status_code == 201, response.content
    assert response.json()["nodes"] == 1 and response.json()["machines"] == []


@pytest.mark.parametrize("strategy", ["single", "dp", "hogwild", "model-parallel"])
def test_strategies_that_cannot_span_machines_are_refused_with_the_reason(
    alice: Client, two_hosts: None, launched: list[int], strategy: str
) -> None:
    response = post(alice, {"strategy": strategy, "nodes": 2})
    assert response.status_code == 400, response.content
    (message,) = response.json()["errors"]["nodes"]
    assert "runs on one machine" in message
    # The registry's strategies that span machines, named by it (it grows).
    spanning = [spec.label for spec in REGISTRY if spec.nodes]
    assert f"{', '.join(spanning[:-1])} and {spanning[-1]} span several machines" in message
    assert not Experiment.objects.exists() and not launched


def test_deepspeed_may_span_machines(alice: Client, two_hosts: None, launched: list[int]) -> None:
    response = post(alice, {"strategy": "deepspeed", "nodes": 2, "processes": 1})
    assert response.status_code == 201, response.content


def test_more_machines_than_are_online_is_refused_with_what_there_is(
    alice: Client, two_hosts: None, launched: list[int]
) -> None:
    response = post(alice, {"strategy": "ddp", "nodes": 3, "processes": 1})
    assert response.status_code == 400, response.content
    (message,) = response.json()["errors"]["nodes"]
    assert message.startswith("DDP asks for 3 machines with 1 process each, but 2 workers online")
    assert "host-a has 2 CPU cores and no GPU; host-b has 2 CPU cores and no GPU" in message


def test_more_cores_per_machine_than_enough_machines_have_is_refused(
    alice: Client, launched: list[int]
) -> None:
    machine_row("big", cpus=8)
    machine_row("small", cpus=2)
    ok = post(alice, {"strategy": "ddp", "nodes": 2, "processes": 2})
    assert ok.status_code == 201, ok.content
    response = post(alice, {"strategy": "ddp", "nodes": 2, "processes": 4})
    assert response.status_code == 400, response.content
    (message,) = response.json()["errors"]["nodes"]
    assert "asks for 2 machines with 4 processes each, but only 1 of them fits" in message
    assert "big has 8 CPU cores" in message and "small has 2 CPU cores" in message


def test_an_offline_machine_does_not_count(alice: Client, launched: list[int]) -> None:
    machine_row("host-a")
    stale = machine_row("host-b")
    WorkerMachine.objects.filter(pk=stale.pk).update(
        reported_at=timezone.now() - timezone.timedelta(hours=1)
    )
    response = post(alice, {"strategy": "ddp", "nodes": 2, "processes": 1})
    assert response.status_code == 400
    assert "but 1 worker online: host-a" in response.json()["errors"]["nodes"][0]
    pinned = post(alice, {"strategy": "ddp", "machines": ["host-a", "host-b"], "processes": 1})
    assert pinned.json()["errors"]["machines"] == ["host-b is not online"]


def test_unknown_pinned_machines_are_refused_with_the_known_ones(
    alice: Client, two_hosts: None, launched: list[int]
) -> None:
    response = post(alice, {"strategy": "ddp", "machines": ["host-a", "host-z"], "processes": 1})
    assert response.status_code == 400
    assert response.json()["errors"]["machines"] == [
        "no worker named host-z: the workers are host-a, host-b"
    ]
    assert not launched


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        ({"nodes": 2, "machines": ["host-a"]}, "machines", "name one machine per node"),
        ({"machines": ["host-a", "host-a"]}, "machines", "each machine may appear once"),
        ({"machines": [1, 2]}, "machines", "worker names"),
        ({"machines": "host-a"}, "machines", "must be a list"),
        ({"nodes": 0}, "nodes", "greater than or equal to 1"),
        ({"nodes": 65}, "nodes", "less than or equal to 64"),
        ({"nodes": "2"}, "nodes", "must be an integer"),
    ],
)
def test_bad_nodes_and_machines_are_refused_on_their_field(
    alice: Client,
    two_hosts: None,
    launched: list[int],
    payload: dict[str, Any],
    field: str,
    message: str,
) -> None:
    response = post(alice, {"strategy": "ddp", "processes": 1, **payload})
    assert response.status_code == 400, response.content
    assert message in " ".join(response.json()["errors"][field]), response.json()


def test_the_form_says_what_machines_mean(alice: Client) -> None:
    page = alice.get("/experiments/new/").content.decode()
    assert 'name="nodes"' in page and 'name="machines"' in page
    assert "Processes are the ranks on each machine" in page


# --- the claim: all or nothing, busy by placement ---


def queued_run(owner: Any, **fields: Any) -> Experiment:
    defaults: dict[str, Any] = {"name": "run", "strategy": "ddp", "processes": 1, "nodes": 2}
    return Experiment.objects.create(owner=owner, **{**defaults, **fields})


def test_a_two_machine_run_claims_both_machines_at_once(user_factory: Any, two_hosts: None) -> None:
    run = queued_run(user_factory())
    assert experiment_claim(experiment_id=run.pk, machine=HOST_A).claimed
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.worker == "host-a"
    node0, node1 = run.placement
    assert (node0["worker"], node0["node_rank"], node1["worker"], node1["node_rank"]) == (
        "host-a", 0, "host-b", 1,
    )  # fmt: skip
    assert node1["address"] == "10.0.0.2" and node0["ranks"] == node1["ranks"] == []
    # One endpoint for both: node 0's address and a port from the range.
    assert node0["rdzv_endpoint"] == node1["rdzv_endpoint"]
    host, port = node0["rdzv_endpoint"].rsplit(":", 1)
    assert host == node0["address"] and int(port) in rdzv_ports()


def test_the_second_run_waits_with_the_reason_and_holds_nothing(
    user_factory: Any, two_hosts: None
) -> None:
    owner = user_factory()
    first, second = queued_run(owner, processes=2), queued_run(owner, processes=2)
    assert experiment_claim(experiment_id=first.pk, machine=HOST_A).claimed
    claim = experiment_claim(experiment_id=second.pk, machine=HOST_B)
    assert not claim.claimed
    assert claim.waiting_reason == (
        f"waiting for 2 machines with 2 free cores each: host-a busy with #{first.pk}; "
        f"host-b busy with #{first.pk}"
    )
    second.refresh_from_db()
    assert second.status == Status.QUEUED and second.placement == []
    assert second.waiting_reason == claim.waiting_reason


def test_a_node_makes_its_machine_busy_for_one_machine_runs(
    user_factory: Any, two_hosts: None
) -> None:
    owner = user_factory()
    spanning = queued_run(owner, processes=2)
    assert experiment_claim(experiment_id=spanning.pk, machine=HOST_A).claimed
    # host-b is node 1 of that run, though the run's worker is host-a.
    local = queued_run(owner, nodes=1, processes=2)
    claim = experiment_claim(experiment_id=local.pk, machine=HOST_B)
    assert claim.waiting_reason == (
        f"waiting for 2 CPU cores on host-b: 2 of 2 in use by #{spanning.pk}"
    )


def test_a_one_machine_run_is_placed_on_its_worker_alone(
    user_factory: Any, two_hosts: None
) -> None:
    run = queued_run(user_factory(), nodes=1)
    assert experiment_claim(experiment_id=run.pk, machine=HOST_B).claimed
    run.refresh_from_db()
    (entry,) = run.placement
    assert entry["worker"] == "host-b" and entry["node_rank"] == 0
    assert "rdzv_endpoint" not in entry  # torchrun --standalone, as before


def test_a_pinned_run_is_sent_to_its_first_machine(user_factory: Any, two_hosts: None) -> None:
    machine_row("host-c")
    run = queued_run(user_factory(), machines=["host-b", "host-c"])
    claim = experiment_claim(experiment_id=run.pk, machine=HOST_A)
    assert claim.routed_to == "host-b" and not claim.claimed
    claim = experiment_claim(experiment_id=run.pk, machine=HOST_B)
    assert claim.claimed
    run.refresh_from_db()
    assert [e["worker"] for e in run.placement] == ["host-b", "host-c"]


def test_a_pinned_run_waits_for_its_own_machines(user_factory: Any, two_hosts: None) -> None:
    machine_row("host-c")
    owner = user_factory()
    busy_c = queued_run(owner, nodes=1, processes=2)
    assert experiment_claim(experiment_id=busy_c.pk, machine=Machine("host-c", 2, frozenset()))
    pinned = queued_run(owner, processes=2, machines=["host-a", "host-c"])
    claim = experiment_claim(experiment_id=pinned.pk, machine=HOST_A)
    assert claim.waiting_reason == (
        f"waiting for 2 machines with 2 free cores each: host-c busy with #{busy_c.pk}"
    )
    Experiment.objects.filter(pk=busy_c.pk).update(status=Status.SUCCEEDED)
    assert experiment_claim(experiment_id=pinned.pk, machine=HOST_A).claimed


def test_a_multi_node_run_never_overtakes_an_earlier_run_on_its_further_machines(
    user_factory: Any, two_hosts: None
) -> None:
    """The queue's turn rule holds on every machine a multi-node run takes, not only on the one
    that claims it: the later run claimed on host-a does not take host-b from the earlier run
    pinned there (queue.py: no backfill)."""
    owner = user_factory()
    earlier = queued_run(owner, nodes=1, processes=2, machines=["host-b"])
    later = queued_run(owner, processes=1)
    claim = experiment_claim(experiment_id=later.pk, machine=HOST_A)
    assert not claim.claimed
    assert claim.waiting_reason == (
        f"waiting for 2 machines with 1 free core each: host-b keeps its turn for #{earlier.pk}"
    )
    # Another machine online: the later run takes that one instead of host-b.
    machine_row("host-c", address="10.0.0.3")
    assert experiment_claim(experiment_id=later.pk, machine=HOST_A).claimed
    later.refresh_from_db()
    assert [e["worker"] for e in later.placement] == ["host-a", "host-c"]
    assert experiment_claim(experiment_id=earlier.pk, machine=HOST_B).claimed


def test_a_machine_that_cannot_host_sends_the_run_to_one_that_can(
    user_factory: Any, two_hosts: None
) -> None:
    machine_row("host-c")
    owner = user_factory()
    busy_a = queued_run(owner, nodes=1, processes=2)
    assert experiment_claim(experiment_id=busy_a.pk, machine=HOST_A).claimed
    run = queued_run(owner, processes=2)
    assert experiment_claim(experiment_id=run.pk, machine=HOST_A).routed_to == "host-b"


def test_too_few_machines_online_is_said(user_factory: Any) -> None:
    machine_row("host-a")
    run = queued_run(user_factory())
    claim = experiment_claim(experiment_id=run.pk, machine=HOST_A)
    assert claim.waiting_reason == (
        "waiting for 2 machines with 1 free core each: 1 machine online (host-a)"
    )


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def taken_port_before_two_free() -> socket.socket:
    """A listening socket on port P, where P+1 and P+2 are free: below the kernel's ephemeral
    range (32768 up), where no other process of the machine is given a port by bind(("", 0))
    meanwhile, and away from the rendezvous ports the stack's runs use (29400-29499)."""
    for port in range(31000, 32700, 3):
        if not (port_free(port + 1) and port_free(port + 2)):
            continue
        taken = socket.socket()
        try:
            taken.bind(("", port))
        except OSError:
            taken.close()
            continue
        taken.listen()
        return taken
    raise RuntimeError("no three free ports in 31000-32700")


def test_the_rendezvous_port_skips_ports_in_use(
    user_factory: Any, two_hosts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with taken_port_before_two_free() as taken:
        bound = taken.getsockname()[1]
        monkeypatch.setenv("TRAINYARD_RDZV_PORTS", f"{bound}-{bound + 2}")
        owner = user_factory()
        first = queued_run(owner)
        assert experiment_claim(experiment_id=first.pk, machine=HOST_A).claimed
        first.refresh_from_db()
        # The bound port is skipped; the next run hosted on host-a skips the first's.
        assert first.placement[0]["rdzv_endpoint"].endswith(f":{bound + 1}")
        running = list(Experiment.objects.filter(status=Status.RUNNING))
        assert rdzv_port_pick(worker="host-a", running=running) == bound + 2
        assert rdzv_port_pick(worker="host-b", running=running) == bound + 1


def test_a_port_range_that_is_not_ports_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_RDZV_PORTS", "29400-x")
    with pytest.raises(ValueError, match="TRAINYARD_RDZV_PORTS"):
        rdzv_ports()
    monkeypatch.setenv("TRAINYARD_RDZV_PORTS", "29400,29410-29411")
    assert rdzv_ports() == [29400, 29410, 29411]


def claims_at_once(runs: list[tuple[Experiment, Machine]]) -> list[bool]:
    """Claim each run on its machine, each in its own thread (its own connection and
    transaction), all released at the same instant; whether each claim started its run."""
    barrier = threading.Barrier(len(runs))
    claims: dict[int, bool] = {}

    def claim(index: int, run: Experiment, machine: Machine) -> None:
        barrier.wait()
        try:
            claims[index] = experiment_claim(experiment_id=run.pk, machine=machine).claimed
        finally:
            close_old_connections()

    threads = [
        threading.Thread(target=claim, args=(i, run, machine))
        for i, (run, machine) in enumerate(runs)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a claim deadlocked"
    return [claims[i] for i in range(len(runs))]


@pytest.mark.django_db(transaction=True)
def test_two_claims_at_once_on_overlapping_machines_never_share_one(
    user_factory: Any, settings: Any
) -> None:
    """Two runs pinned to partly overlapping machines (E on host-a + host-c, L on host-b +
    host-c), claimed in the same instant on host-a and host-b, in real concurrent transactions:
    only the machines' locks (allocation.machines_lock) keep both from taking all of host-c.
    The queue's turn rule cannot: host-a's report is stale, so for L's claim E looks unplaceable
    (queue.run_placeable) and holds nobody up, while host-a's own worker claims E all the same.
    Many rounds, as the race is one of timing (without the locks it is lost within a few)."""
    settings.TRAINYARD_WORKER_STALE_SECONDS = 60
    machine_row("host-a")
    WorkerMachine.objects.filter(hostname="host-a").update(
        reported_at=timezone.now() - timedelta(minutes=10)
    )
    machine_row("host-b")
    machine_row("host-c")
    # Two owners: the running limit's lock on one owner's row would serialise the claims.
    erin, leo = user_factory(), user_factory()
    for _ in range(8):
        early = queued_run(erin, processes=2, machines=["host-a", "host-c"])
        late = queued_run(leo, processes=2, machines=["host-b", "host-c"])
        started = claims_at_once([(early, HOST_A), (late, HOST_B)])
        assert sorted(started) == [False, True], started
        running = Experiment.objects.filter(status=Status.RUNNING)
        assert [w for run in running for w in placement_names(run)].count("host-c") == 1
        # Whichever lost waits for host-c, busy with the winner.
        (loser,) = Experiment.objects.filter(status=Status.QUEUED, pk__in=[early.pk, late.pk])
        assert "host-c busy with" in loser.waiting_reason, loser.waiting_reason
        # Ended as if never started: the users' turns (scheduling/fair.py) would alternate, and a
        # claim whose turn it is not waits for the other's without racing it.
        Experiment.objects.filter(pk__in=[early.pk, late.pk]).update(
            status=Status.SUCCEEDED, started_at=None
        )


def placement_names(run: Experiment) -> list[str]:
    return [str(entry["worker"]) for entry in run.placement]


# --- where the other machines reach a worker ---


def test_a_worker_reports_the_address_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from dashboard.devices.reporter import machine_report_save

    monkeypatch.setenv("TRAINYARD_WORKER_ADDRESS", "198.18.0.7")
    machine = machine_report_save(facts={"hostname": "host-n", "cpu_count": 2})
    assert machine.address == "198.18.0.7"


def test_the_default_address_is_this_hosts_route_to_the_broker(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from dashboard.devices.facts import worker_address

    monkeypatch.delenv("TRAINYARD_WORKER_ADDRESS", raising=False)
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    assert worker_address() == "127.0.0.1"  # the broker is on this host: the loopback
    # An address of this host's own outside interface, where one exists.
    settings.CELERY_BROKER_URL = "redis://198.51.100.1:6379/0"
    address = worker_address()
    assert address and not address.startswith("127."), address


def test_the_device_page_and_api_show_the_address_and_queue(alice: Client) -> None:
    machine_row("host-a", address="10.0.0.1")
    page = alice.get("/devices/").content.decode()
    assert "10.0.0.1 · queue machine.host-a" in page
    (item,) = alice.get("/api/devices/").json()["machines"]
    assert item["address"] == "10.0.0.1"


def test_the_devices_label_says_the_processes_are_on_each_machine() -> None:
    def label(**fields: Any) -> str:
        return experiment_devices_label(experiment=Experiment(**fields))

    assert label(strategy="ddp", processes=1, nodes=2) == "1 CPU process on each of 2 machines"
    assert label(strategy="ddp", processes=2) == "2 CPU processes"
    assert label(strategy="ddp", gpus=[0, 1], nodes=3) == "GPU 0,1 on each of 3 machines"
