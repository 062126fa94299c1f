"""tally.app.handlers: the Kopf registrations that NoEssenceDiffBase relies on."""

from __future__ import annotations

import kopf
import pytest

import tally.app.handlers as handlers
from tally.app import kopf_settings

pytestmark = pytest.mark.unit


def test_no_change_or_spawning_handlers_are_registered() -> None:
    # Kopf's diff base is switched off (NoEssenceDiffBase): a create/update/resume/field
    # handler or a daemon/timer would see no changes, so none may exist.
    registry = kopf.get_default_registry()
    assert registry._watching.get_all_handlers()
    assert not registry._changing.get_all_handlers()
    assert not registry._spawning.get_all_handlers()


def test_the_diff_base_builds_nothing_and_refuses_to_store() -> None:
    storage = kopf_settings.NoEssenceDiffBase()
    body = kopf.Body({"metadata": {"name": "p"}, "spec": {"a": 1}})
    assert storage.build(body=body) is None
    assert storage.fetch(body=body) is None
    with pytest.raises(RuntimeError, match="no change handlers"):
        storage.store(body=body, patch=kopf.Patch(), essence=kopf.BodyEssence())


def test_a_failed_start_is_tried_again_within_seconds() -> None:
    # A replica restarted while the API server is unreachable fails its start. The soak
    # (bench/soak.py) restarts the API server in 5-20 s on this machine; Kopf's default retry
    # (60 s) left such a replica unready for a minute after the API server was back.
    starts = [
        handler
        for handler in kopf.get_default_registry()._activities.get_all_handlers()
        if handler.fn is handlers.start
    ]
    assert 1 == len(starts)
    assert starts[0].backoff is not None
    assert starts[0].backoff <= 5.0


class FakeClient:
    def __init__(self, connections: int | None) -> None:
        self.connections = connections
        self.closed = False

    async def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("failing", ["second-client", "version", "watch-list"])
async def test_a_failed_start_closes_every_client_it_opened(
    monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    # Kopf retries a failed start every few seconds through an API server outage: a client
    # left open per attempt would pile up.
    opened: list[FakeClient] = []

    async def make_api_client(connections: int | None) -> FakeClient:
        if failing == "second-client" and opened:
            raise RuntimeError("no kubeconfig")
        opened.append(FakeClient(connections))
        return opened[-1]

    async def server_version(api: object) -> str:
        if failing == "watch-list":
            return "v1.37.1"
        raise RuntimeError("API server unreachable")

    async def serves_watch_list(api: object) -> bool:
        raise RuntimeError("the probe's watch was cut")

    monkeypatch.delenv("TALLY_API_CONNECTIONS", raising=False)
    monkeypatch.setattr(handlers.rest, "make_api_client", make_api_client)
    monkeypatch.setattr(handlers.rest, "server_version", server_version)
    monkeypatch.setattr(handlers.rest, "serves_watch_list", serves_watch_list)
    with pytest.raises(RuntimeError):
        await handlers.start(settings=None, memo=kopf.Memo())  # type: ignore[arg-type]
    # The requests' client has the limit, admission's and the watches' none.
    assert [16, None, None][: len(opened)] == [c.connections for c in opened]
    assert len(opened) == (1 if failing == "second-client" else 3)
    assert all(c.closed for c in opened)


@pytest.mark.parametrize("streamed", [True, False])
def test_kopf_lists_as_the_api_server_can(streamed: bool) -> None:
    settings = kopf.OperatorSettings()
    kopf_settings.configure_kopf(settings, initial_streaming=streamed)
    assert streamed is settings.watching.initial_streaming
    assert kopf_settings.LISTING_PAGE == settings.watching.chunk_size
    watching = settings.watching
    assert watching.server_timeout is not None
    assert watching.client_timeout is not None
    # The API server ends a watch (a streamed listing included), never the client mid-way.
    assert watching.client_timeout > watching.server_timeout
    # A dead connection is noticed long before either: the API server sends a bookmark every
    # minute.
    assert 60 < watching.inactivity_timeout < watching.server_timeout
