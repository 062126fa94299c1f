"""tally.kube.charge_verifier: the question a charge's object is asked with, and every outcome of
it turned into an answer.

The request is ``tally.kube.rest.get_json`` replaced by :class:`FakeGet`, which records what it
was asked and answers with a LIST's JSON or raises what the client would. What the answers
mean is tested in ``test_charges.py``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

import builders
from tally.charges import (
    Answer,
    Charge,
    ChargeLedger,
    Listed,
    ObjectRef,
    ObjectVersion,
    Unanswered,
    Unasked,
)
from tally.evaluators.base import GroupResource
from tally.kube import rest
from tally.kube.charge_verifier import KubeChargeVerifier, escape_field_value, stored_version
from tally.machinery.cache import Store
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit

PODS = GroupResource("", "pods")
PODSETS = GroupResource("tally.dev", "podsets")
WIDGETS = GroupResource("example.com", "widgets")
TIMEOUT = 5.0


class FakeGet:
    """``rest.get_json``: records (path, query) and answers with ``answer`` (a LIST's JSON) or
    raises it."""

    def __init__(self, answer: dict[str, Any] | BaseException) -> None:
        self.answer = answer
        self.calls: list[tuple[str, list[tuple[str, str]]]] = []
        self.accepted: list[str] = []

    async def __call__(
        self,
        api: object,
        path: str,
        query: list[tuple[str, str]] | None = None,
        *,
        accept: str = "application/json",
    ) -> dict[str, Any]:
        self.calls.append((path, list(query or [])))
        self.accepted.append(accept)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


# Pods as the API lists them here: metadata only.
pod = functools.partial(builders.pod, namespace="a", bare=True)


def versions(gr: GroupResource) -> str | None:
    return {PODS: "v1", PODSETS: "v1alpha1"}.get(gr)


@pytest.fixture
def stores() -> dict[GroupResource, Store[Any]]:
    return {PODS: Store(lambda obj: obj, name="pods")}


@pytest.fixture
async def verifier(stores: dict[GroupResource, Store[Any]]) -> AsyncIterator[KubeChargeVerifier]:
    api = client.ApiClient()  # never used: every request goes to a FakeGet
    built = KubeChargeVerifier(api, timeout=TIMEOUT, version_of=versions, stores=stores)
    yield built
    await built.stop()
    await api.close()


def use(monkeypatch: pytest.MonkeyPatch, get: FakeGet) -> FakeGet:
    monkeypatch.setattr(rest, "get_json", get)
    return get


async def test_the_question_is_a_list_of_the_namespace_by_name(
    verifier: KubeChargeVerifier,
    stores: dict[GroupResource, Store[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stores[PODS].upsert(pod("p", uid="u1", resource_version="6"))  # the caches are one write behind
    get = use(
        monkeypatch, FakeGet({"items": [pod("p", uid="u1", resource_version="7")], "metadata": {}})
    )

    answer = await verifier.ask(ObjectRef(PODS, "a", "p"))

    # No resourceVersion: a consistent read, not the API server's watch cache.
    assert [("/api/v1/namespaces/a/pods", [("fieldSelector", "metadata.name=p")])] == get.calls
    # The items' metadata only (the API server's PartialObjectMetadataList): a Secret near
    # 1 MiB answers a few hundred bytes.
    assert ["application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"] == get.accepted
    assert Listed(ObjectVersion("u1", "7"), cached=ObjectVersion("u1", "6")) == answer


async def test_a_custom_resource_is_listed_at_its_version(
    verifier: KubeChargeVerifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    get = use(monkeypatch, FakeGet({"items": []}))
    assert Listed(None) == await verifier.ask(ObjectRef(PODSETS, "a", "web"))
    assert [("/apis/tally.dev/v1alpha1/namespaces/a/podsets",
             [("fieldSelector", "metadata.name=web")])] == get.calls  # fmt: skip


async def test_a_kind_no_longer_watched_is_not_stored_unasked(
    verifier: KubeChargeVerifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    get = use(monkeypatch, FakeGet({"items": [pod("w", uid="u1", resource_version="7")]}))
    assert Listed(None) == await verifier.ask(ObjectRef(WIDGETS, "a", "w"))
    assert [] == get.calls


@pytest.mark.parametrize(
    ("raised", "answer"),
    [
        pytest.param(client.ApiException(status=403, reason="Forbidden"),
                     Unanswered(403, "Forbidden"), id="403"),
        pytest.param(client.ApiException(status=401, reason="Unauthorized"),
                     Unanswered(401, "Unauthorized"), id="401"),
        pytest.param(client.ApiException(status=404, reason="Not Found"),
                     Unanswered(404, "Not Found"), id="404"),
        pytest.param(client.ApiException(status=503, reason="Service Unavailable"),
                     Unanswered(503, "Service Unavailable"), id="503"),
        # Each question may take 0.8 of the 5 s timeout.
        pytest.param(TimeoutError(), Unanswered(None, "no answer within 4 s"), id="timeout"),
        pytest.param(aiohttp.ServerDisconnectedError("gone"),
                     Unanswered(None, "ServerDisconnectedError: gone"), id="connection error"),
        pytest.param(TypeError("expected a JSON object, got list"),
                     Unanswered(None, "TypeError: expected a JSON object, got list"),
                     id="an answer that is not a LIST"),
    ],
)  # fmt: skip
async def test_every_failure_is_an_answer(
    verifier: KubeChargeVerifier,
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
    answer: Unanswered,
) -> None:
    use(monkeypatch, FakeGet(raised))
    assert answer == await verifier.ask(ObjectRef(PODS, "a", "p"))


class HangingGet(FakeGet):
    """A question the API server never answers."""

    def __init__(self) -> None:
        super().__init__({})

    async def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        await super().__call__(*args, **kwargs)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_question_without_a_slot_in_its_time_was_never_sent(
    stores: dict[GroupResource, Store[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    get = use(monkeypatch, HangingGet())
    api = client.ApiClient()
    # One slot; a timeout of 0.05 s gives each question 0.04 s.
    verifier = KubeChargeVerifier(api, timeout=0.05, version_of=versions, stores=stores,
                                  concurrency=1)  # fmt: skip
    try:
        sent, unsent = await asyncio.gather(
            verifier.ask(ObjectRef(PODS, "a", "p")), verifier.ask(ObjectRef(PODS, "a", "q"))
        )
        # The first held the slot and got no answer; the second never reached the API.
        assert Unanswered(None, "no answer within 0.04 s") == sent
        assert Unasked("no slot within 0.04 s: 1 question(s) in flight") == unsent
        assert 1 == len(get.calls)
        # The slot is free again once the question that held it gave up.
        monkeypatch.setattr(rest, "get_json", FakeGet({"items": []}))
        assert Listed(None) == await verifier.ask(ObjectRef(PODS, "a", "r"))
    finally:
        await verifier.stop()
        await api.close()


class Answers:
    """The ledger's answer callback: records each answer; :meth:`wait` returns once ``expected``
    came."""

    def __init__(self, expected: int) -> None:
        self.got: list[tuple[Charge, Answer]] = []
        self._expected = expected
        self._all = asyncio.Event()

    def __call__(self, charge: Charge, answer: Answer) -> None:
        self.got.append((charge, answer))
        if len(self.got) == self._expected:
            self._all.set()

    async def wait(self) -> None:
        await asyncio.wait_for(self._all.wait(), 1)


async def test_verify_answers_once_per_charge(
    verifier: KubeChargeVerifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    get = use(monkeypatch, FakeGet({"items": [pod("p", uid="u-p", resource_version="7")]}))
    ledger = ChargeLedger(TIMEOUT)
    amounts = {("a", "q"): {"pods": Quantity.parse("1")}}
    charges = [
        ledger.record(ObjectRef(PODS, "a", name), "u-" + name, "", amounts) for name in ("p", "q")
    ]
    answers = Answers(expected=2)

    verifier.verify(charges, answers)
    await answers.wait()

    # One LIST per charge; the fake's page holds "p" only.
    assert 2 == len(get.calls)
    assert [(charges[0], Listed(ObjectVersion("u-p", "7"))), (charges[1], Listed(None))] == sorted(
        answers.got, key=lambda pair: charges.index(pair[0])
    )


@pytest.mark.parametrize(
    ("page", "found"),
    [
        pytest.param({"items": [pod("p", uid="u1", resource_version="7")]},
                     ObjectVersion("u1", "7"), id="found"),
        pytest.param({"items": []}, None, id="none"),
        pytest.param({"metadata": {}}, None, id="no items at all"),
        pytest.param({"items": [pod("other", uid="u2", resource_version="3")]}, None,
                     id="only another name"),
        pytest.param({"items": [{"kind": "Pod"}, pod("p", uid="u1", resource_version="7")]},
                     ObjectVersion("u1", "7"), id="an item without metadata skipped"),
    ],
)  # fmt: skip
def test_stored_version(page: dict[str, Any], found: ObjectVersion | None) -> None:
    assert found == stored_version(page, "p")


@pytest.mark.parametrize(
    ("name", "escaped"),
    [
        pytest.param("web-1", "web-1", id="a DNS name as it is"),
        pytest.param("a,b", "a\\,b", id="comma"),
        pytest.param("a=b", "a\\=b", id="equals"),
        pytest.param("a\\b", "a\\\\b", id="backslash first"),
    ],
)
def test_escape_field_value(name: str, escaped: str) -> None:
    assert escaped == escape_field_value(name)
