"""tally.kube.quota_accessor.KubeQuotaAccessor.usage_raised: this process's own status writes
against other replicas' raises of ``status.used``, seen on the quota watch.

The PUTs are ``tally.kube.rest.put_json`` replaced by :class:`FakePut`: it answers with the body at
a chosen resourceVersion, can wait on an event (the watch event arriving before the PUT returns)
and can fail with 409.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import pytest
from kubernetes_asyncio import client

import builders
from tally.charges import ChargeLedger
from tally.clusterquota.quota import raised_shares
from tally.kube import rest
from tally.kube.cluster_quotas import REFUSED_SIZE_MEMORY_S, KubeClusterQuotaWriter
from tally.kube.quota_accessor import KubeQuotaAccessor
from tally.machinery.cache import Store
from tally.machinery.errors import Conflict, TooLarge
from tally.quota.identity import QuotaKey, cluster_quota_key
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit

KEY = QuotaKey("a", "q")
OTHER_KEY = QuotaKey("a", "other")
RAISE = {"cpu": Quantity.parse("1")}


# The quota a/q (KEY) as stored: a status and no spec.
quota = functools.partial(
    builders.resource_quota,
    name="q",
    namespace="a",
    resource_version="1",
    used={"cpu": "1"},
    status_hard={"cpu": "10"},
    with_kind=True,
)


class FakePut:
    """``rest.put_json``: each call takes the next answer; an answer is the resourceVersion to
    store at, or an ``ApiException`` to raise. Every call waits for ``gate`` first (open until
    a test closes it)."""

    def __init__(self) -> None:
        self.answers: list[str | client.ApiException] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.calls: list[str] = []
        self.clients: list[object] = []

    async def __call__(self, api: object, path: str, body: Any) -> dict[str, Any]:
        self.calls.append(path)
        self.clients.append(api)
        answer = self.answers.pop(0)
        await self.gate.wait()
        if isinstance(answer, client.ApiException):
            raise answer
        return {**body, "metadata": {**body["metadata"], "resourceVersion": answer}}


@pytest.fixture
def put(monkeypatch: pytest.MonkeyPatch) -> FakePut:
    fake = FakePut()
    monkeypatch.setattr(rest, "put_json", fake)
    return fake


@pytest.fixture
def ledger() -> ChargeLedger:
    return ChargeLedger(60.0)


@pytest.fixture
def accessor(ledger: ChargeLedger) -> KubeQuotaAccessor:
    return KubeQuotaAccessor(Store(lambda o: o), api=object(), charges=ledger)  # type: ignore[arg-type]


async def write(accessor: KubeQuotaAccessor, put: FakePut, rv: str, key: QuotaKey = KEY) -> None:
    put.answers.append(rv)
    stored = await accessor.update_quota_status(quota(name=key.name, namespace=key.namespace))
    assert rv == stored["metadata"]["resourceVersion"]


def start_write(
    accessor: KubeQuotaAccessor, put: FakePut, answer: str | client.ApiException
) -> asyncio.Future[Any]:
    """A PUT left in flight until ``put.gate`` is set."""
    put.gate.clear()
    put.answers.append(answer)
    return asyncio.ensure_future(accessor.update_quota_status(quota()))


async def in_flight() -> None:
    """Let a started PUT reach its gate."""
    for _ in range(3):
        await asyncio.sleep(0)


# -- classification after the PUT returned


async def test_event_for_own_write_holds_nothing(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    await write(accessor, put, "42")
    assert ["/api/v1/namespaces/a/resourcequotas/q/status"] == put.calls

    accessor.writes.usage_raised(KEY, "42", dict(RAISE))

    assert {} == ledger.held(KEY)
    assert 0 == len(ledger)


async def test_raise_nobody_here_wrote_is_held(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    await write(accessor, put, "42")

    accessor.writes.usage_raised(KEY, "43", dict(RAISE))

    assert RAISE == ledger.held(KEY)
    assert 1 == len(ledger)


def test_raise_without_any_write_is_held(accessor: KubeQuotaAccessor, ledger: ChargeLedger) -> None:
    accessor.writes.usage_raised(KEY, "7", dict(RAISE))
    assert RAISE == ledger.held(KEY)


async def test_own_write_of_another_quota_does_not_cover_this_one(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    await write(accessor, put, "42", key=OTHER_KEY)

    accessor.writes.usage_raised(KEY, "42", dict(RAISE))

    assert RAISE == ledger.held(KEY)
    assert {} == ledger.held(OTHER_KEY)


async def test_event_with_empty_amount_never_holds(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    accessor.writes.usage_raised(KEY, "5", {})
    await write(accessor, put, "6")
    accessor.writes.usage_raised(KEY, "7", {})
    pending = start_write(accessor, put, "9")
    await in_flight()
    accessor.writes.usage_raised(KEY, "8", {})
    put.gate.set()
    await pending

    assert 0 == len(ledger)
    assert {} == ledger.held(KEY)


def test_unparsable_resource_version_is_ignored(
    accessor: KubeQuotaAccessor, ledger: ChargeLedger
) -> None:
    accessor.writes.usage_raised(KEY, "", dict(RAISE))
    accessor.writes.usage_raised(KEY, "not-a-number", dict(RAISE))
    assert 0 == len(ledger)


# -- events that arrive while a PUT is in flight


async def test_event_before_own_put_returns_holds_nothing(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    pending = start_write(accessor, put, "42")
    await in_flight()

    accessor.writes.usage_raised(KEY, "42", dict(RAISE))
    # Undecided while the PUT is in flight: held meanwhile, so that no recalculation erases
    # it should it be another replica's; withdrawn once the write turns out to be ours.
    assert RAISE == ledger.held(KEY)

    put.gate.set()
    await pending
    assert {} == ledger.held(KEY)
    assert 0 == len(ledger)


async def test_other_raise_during_own_put_is_held_and_stays_held_once_it_returns(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    pending = start_write(accessor, put, "42")
    await in_flight()

    accessor.writes.usage_raised(KEY, "41", dict(RAISE))
    assert RAISE == ledger.held(KEY)

    put.gate.set()
    await pending
    assert RAISE == ledger.held(KEY)
    assert 1 == len(ledger)


async def test_raise_during_failed_put_is_held(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    pending = start_write(accessor, put, client.ApiException(status=409, reason="Conflict"))
    await in_flight()

    accessor.writes.usage_raised(KEY, "42", dict(RAISE))
    assert RAISE == ledger.held(KEY)

    put.gate.set()
    with pytest.raises(Conflict):
        await pending
    assert RAISE == ledger.held(KEY)


async def test_raises_wait_for_every_put_in_flight(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    put.gate.clear()
    put.answers += ["42", "43"]
    first = asyncio.ensure_future(accessor.update_quota_status(quota()))
    second = asyncio.ensure_future(accessor.update_quota_status(quota()))
    await in_flight()

    accessor.writes.usage_raised(KEY, "42", dict(RAISE))
    accessor.writes.usage_raised(KEY, "43", dict(RAISE))
    accessor.writes.usage_raised(KEY, "44", dict(RAISE))  # nobody's here

    put.gate.set()
    await asyncio.gather(first, second)
    assert RAISE == ledger.held(KEY)
    assert 1 == len(ledger)


# -- the maps shrink


async def test_forget_leaves_nothing_behind(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    await write(accessor, put, "42")
    pending = start_write(accessor, put, "44")
    await in_flight()
    accessor.writes.usage_raised(KEY, "43", dict(RAISE))
    assert KEY in accessor.writes._writing
    assert KEY in accessor.writes._written
    assert KEY in accessor.writes._unsure

    accessor.writes.forget(KEY)

    assert KEY not in accessor.writes._writing
    assert KEY not in accessor.writes._written
    assert KEY not in accessor.writes._unsure
    put.gate.set()
    await pending


async def test_events_prune_own_write_versions_up_to_theirs(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    for rv in ("40", "42", "45"):
        await write(accessor, put, rv)
    assert {40, 42, 45} == accessor.writes._written[KEY]

    accessor.writes.usage_raised(KEY, "42", {})
    assert {45} == accessor.writes._written[KEY]

    accessor.writes.usage_raised(KEY, "45", dict(RAISE))
    assert KEY not in accessor.writes._written
    assert 0 == len(ledger)  # 45 was ours
    assert {} == accessor.writes._writing
    assert {} == accessor.writes._unsure


async def test_pruned_own_version_no_longer_covers_a_raise(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    await write(accessor, put, "40")
    accessor.writes.usage_raised(KEY, "41", {})  # 40's event was lost: it is forgotten

    accessor.writes.usage_raised(KEY, "40", dict(RAISE))

    assert RAISE == ledger.held(KEY)


async def test_own_raise_waiting_behind_a_put_survives_a_later_event(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    await write(accessor, put, "5")  # own write at 5; its event has not arrived yet
    pending = start_write(accessor, put, client.ApiException(status=409, reason="Conflict"))
    await in_flight()
    accessor.writes.usage_raised(KEY, "5", dict(RAISE))  # own write: waits behind the PUT in flight
    accessor.writes.usage_raised(KEY, "6", {})  # another writer lowered usage: classified now

    put.gate.set()
    with pytest.raises(Conflict):
        await pending

    assert {} == ledger.held(KEY)


async def test_forget_during_a_put_leaves_nothing_behind(
    accessor: KubeQuotaAccessor, put: FakePut
) -> None:
    pending = start_write(accessor, put, "44")
    await in_flight()

    accessor.writes.forget(KEY)  # the quota's deletion is seen before the PUT's answer
    put.gate.set()
    await pending

    assert KEY not in accessor.writes._written


# -- ClusterQuotas: their writer tells the accessor; a raise is held per namespace share


async def test_cluster_quota_raises_are_held_per_share_unless_this_process_wrote_them(
    accessor: KubeQuotaAccessor, put: FakePut, ledger: ChargeLedger
) -> None:
    writer = KubeClusterQuotaWriter(object(), tracker=accessor.writes)  # type: ignore[arg-type]
    put.answers.append("50")
    await writer.put_status({"metadata": {"name": "team", "resourceVersion": "49"}})
    key = cluster_quota_key("", "team")
    shares = {
        cluster_quota_key("a", "team"): dict(RAISE),
        cluster_quota_key("b", "team"): dict(RAISE),
    }
    accessor.writes.raised(key, "50", shares)  # our own write
    assert 0 == len(ledger)
    accessor.writes.raised(key, "51", shares)  # another replica's
    assert (RAISE, RAISE) == (
        ledger.held(cluster_quota_key("a", "team")),
        ledger.held(cluster_quota_key("b", "team")),
    )


def test_raised_shares_are_what_grew_per_namespace() -> None:
    def cq(total: dict[str, str] | None, shares: dict[str, dict[str, str]]) -> dict[str, Any]:
        status: dict[str, Any] = {
            "namespaces": [{"namespace": ns, "status": {"used": u}} for ns, u in shares.items()]
        }
        if total is not None:
            status["total"] = {"used": total}
        return {"status": status}

    old = cq({"pods": "3", "cpu": "1"}, {"a": {"pods": "3", "cpu": "1"}})
    new = cq({"pods": "5", "cpu": "1", "memory": "1Gi"},
             {"a": {"pods": "4", "cpu": "1"}, "b": {"pods": "1", "memory": "1Gi"}})  # fmt: skip
    assert {"a": {"pods": Quantity.parse("1")}, "b": {"pods": Quantity.parse("1")}} == (
        raised_shares(old, new)  # memory is new in the total: a first calculation
    )
    assert {} == raised_shares(cq(None, {}), new)  # no total before: the first calculation
    assert {} == raised_shares(new, old)  # lowered: nothing raised


async def test_a_copy_read_after_a_lost_write_is_for_admission_not_the_controller(
    monkeypatch: pytest.MonkeyPatch, ledger: ChargeLedger
) -> None:
    # The controller writes over newest(); a copy its watch has not delivered may carry
    # another replica's raise that is not held yet, so it must not see one.
    cached = quota(resource_version="5")
    live = quota(resource_version="9", used={"cpu": "3"})
    store: Store[dict[str, Any]] = Store(lambda o: o)
    store.upsert(cached)

    async def get_json(api: object, path: str) -> dict[str, Any]:
        return live

    monkeypatch.setattr(rest, "get_json", get_json)
    accessor = KubeQuotaAccessor(store, api=object(), charges=ledger)  # type: ignore[arg-type]
    await accessor.refresh(cached)
    assert cached is accessor.newest(cached)
    assert [live] == await accessor.get_quotas("a")


# -- which client: admission's writes never queue behind the controllers' requests


async def test_admission_and_the_controller_write_through_their_own_clients(
    put: FakePut, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The controllers' client has a connection limit; a pod create the PodSet controller holds
    # one of those connections for waits on this webhook's write, so admission's must not
    # wait for one in turn.
    admission, controller = object(), object()
    read: list[object] = []

    async def get_json(api: object, path: str) -> dict[str, Any]:
        read.append(api)
        return quota(resource_version="9")

    monkeypatch.setattr(rest, "get_json", get_json)
    accessor = KubeQuotaAccessor(
        Store(lambda o: o),
        api=admission,  # type: ignore[arg-type]
        controller_api=controller,  # type: ignore[arg-type]
    )
    put.answers += ["2", "3"]
    await accessor.update_quota_status(quota())
    await accessor.update_status(quota(resource_version="2"), {"used": {"cpu": "2"}})
    await accessor.refresh(quota())
    assert [admission, controller] == put.clients
    assert [admission] == read

    writer = KubeClusterQuotaWriter(
        admission,  # type: ignore[arg-type]
        controller_api=controller,  # type: ignore[arg-type]
    )
    put.clients.clear()
    put.answers += ["5", "6"]
    await writer.put_status({"metadata": {"name": "team", "resourceVersion": "4"}})
    await writer.update_status({"metadata": {"name": "team", "resourceVersion": "5"}}, {})
    assert [admission, controller] == put.clients


@pytest.mark.parametrize(
    ("status", "body", "refused_for_size"),
    [
        (413, '{"message":"Request entity too large: limit is 3145728","code":413}', True),
        (500, '{"message":"etcdserver: request is too large","code":500}', True),
        (500, '{"message":"rpc error: code = ResourceExhausted desc = trying to send message '
              'larger than max (2260859 vs. 2097152)","code":500}', True),
        (500, '{"message":"etcdserver: leader changed","code":500}', False),
        (409, '{"message":"the object has been modified","code":409}', False),
    ],
)  # fmt: skip
async def test_a_status_the_api_server_refuses_for_its_size_says_so(
    put: FakePut, status: int, body: str, refused_for_size: bool
) -> None:
    # The API server's answers, as it gave them on a local plane for statuses of 1.9, 2.3 and
    # 3.6 MB (etcd's request limit, its gRPC limit, the API server's body limit).
    writer = KubeClusterQuotaWriter(object())  # type: ignore[arg-type]
    put.answers.append(client.ApiException(status=status, reason="x"))
    put.answers[-1].body = body  # type: ignore[union-attr]
    cq = {"metadata": {"name": "team", "resourceVersion": "4"}, "status": {"total": {}}}
    with pytest.raises((TooLarge, Conflict, client.ApiException)) as raised:
        await writer.put_status(cq)
    assert refused_for_size == isinstance(raised.value, TooLarge)
    if refused_for_size:
        message = json.loads(body)["message"]
        assert str(raised.value).startswith(
            f"clusterquotas/team: the API server refused its status of 12 bytes as too large "
            f"({message});"
        ), str(raised.value)


def _refused_for_size() -> client.ApiException:
    error = client.ApiException(status=500, reason="Internal Server Error")
    error.body = '{"message":"etcdserver: request is too large","code":500}'
    return error


def _cluster_quota(namespaces: int) -> dict[str, Any]:
    # Each listed namespace adds the same bytes: sizes compare as the namespace counts do.
    listed = [
        {"namespace": f"ns-{i:04}", "status": {"used": {"pods": "1"}}} for i in range(namespaces)
    ]
    return {"metadata": {"name": "team", "resourceVersion": "4"}, "status": {"namespaces": listed}}


async def test_a_status_as_large_as_one_refused_is_not_sent_again_for_a_while(
    put: FakePut,
) -> None:
    # At the limit every admission pass would send a body the API server must read and
    # decode before etcd refuses it; one at least as large is refused here instead, until
    # the memory lapses (the limit may have been raised).
    now = [1000.0]
    writer = KubeClusterQuotaWriter(object(), clock=lambda: now[0])  # type: ignore[arg-type]
    put.answers.append(_refused_for_size())
    with pytest.raises(TooLarge):
        await writer.put_status(_cluster_quota(50))
    assert 1 == len(put.calls)

    now[0] += 10
    for namespaces in (50, 51):
        with pytest.raises(TooLarge) as raised:
            await writer.put_status(_cluster_quota(namespaces))
        size = len(json.dumps(_cluster_quota(namespaces)["status"], separators=(",", ":")))
        limit = len(json.dumps(_cluster_quota(50)["status"], separators=(",", ":")))
        assert (
            f"clusterquotas/team: its status of {size} bytes was not sent: the API server refused "
            f"one of {limit} bytes as too large 10 s ago;"
        ) in str(raised.value)
    assert 1 == len(put.calls)

    # A smaller one is sent.
    put.answers.append("5")
    await writer.put_status(_cluster_quota(49))
    assert 2 == len(put.calls)

    # Once the memory lapses, even the refused size is sent again.
    now[0] += REFUSED_SIZE_MEMORY_S
    put.answers.append("6")
    await writer.put_status(_cluster_quota(50))
    assert 3 == len(put.calls)
