"""tally.kube.reflector: the LIST/WATCH state machine, driven by a scripted source and a fake sleep.

Covers what client-go's ``reflector_test.go`` covers for one resource: the list's
resourceVersion starts the watch, events reach the store, bookmarks move the resume point,
410 (status or ERROR event) re-lists and drops ghosts, connection errors back off and resume
without a LIST, 403/404 stop the reflector and report. Not covered here: the aiohttp stream
(the e2e test ``test_count_custom_resources`` runs it against a real API server).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import pytest

from tally.kube.reflector import (
    Backoff,
    ErrorEvent,
    Reflector,
    StatusError,
    _parse_event,
    _status_error_from_body,
    classify,
)
from tally.machinery.cache import Store

pytestmark = pytest.mark.unit

Obj = Mapping[str, Any]


def obj(name: str, rv: str, ns: str = "a") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": rv}
    }


def event(kind: str, name: str, rv: str) -> dict[str, Any]:
    if kind == "BOOKMARK":
        return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}}
    return {"type": kind, "object": obj(name, rv)}


def error_event(code: int, reason: str = "Expired") -> dict[str, Any]:
    return {"type": "ERROR", "object": {"kind": "Status", "code": code, "reason": reason}}


class ScriptedSource:
    """Answers LISTs and WATCHes from scripts; once the watch script runs out, the next watch
    blocks until cancelled and sets ``idle`` (the test then inspects and stops)."""

    def __init__(
        self,
        lists: list[tuple[list[Obj], str] | Exception],
        watches: list[list[Obj | Exception]],
    ) -> None:
        self.lists = deque(lists)
        self.watches = deque(watches)
        self.calls: list[str] = []
        self.idle = asyncio.Event()
        self._pages: list[Obj] = []

    async def list_page(self, continue_token: str, limit: int) -> Obj:
        if not continue_token:
            self.calls.append("list")
            script = self.lists.popleft()
            if isinstance(script, Exception):
                raise script
            items, rv = script
            chunks = [items[i : i + limit] for i in range(0, len(items), limit)] or [[]]
            self._pages = [
                {
                    "items": chunk,
                    "metadata": {
                        "resourceVersion": rv,
                        "continue": f"page-{n + 1}" if n + 1 < len(chunks) else "",
                    },
                }
                for n, chunk in enumerate(chunks)
            ]
            return self._pages[0]
        self.calls.append(f"list {continue_token}")
        return self._pages[int(continue_token.removeprefix("page-"))]

    async def watch(self, resource_version: str, timeout_seconds: int) -> AsyncGenerator[Obj, None]:
        self.calls.append(f"watch {resource_version}")
        if not self.watches:
            self.idle.set()
            await asyncio.Event().wait()
        for item in self.watches.popleft():
            if isinstance(item, Exception):
                raise item
            yield item


class Recorder:
    def __init__(self) -> None:
        self.sleeps: list[float] = []
        self.synced = 0
        self.failures: list[StatusError] = []

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        await asyncio.sleep(0)


def make(source: ScriptedSource, recorder: Recorder, **kwargs: Any) -> Reflector:
    def on_synced() -> None:
        recorder.synced += 1

    return Reflector(
        source,
        Store(lambda o: f"{o['metadata']['name']}@{o['metadata']['resourceVersion']}"),
        name="widgets.example.com",
        on_synced=on_synced,
        on_failure=recorder.failures.append,
        watch_timeout=lambda: 300,
        sleep=recorder.sleep,
        **kwargs,
    )


async def run_until_idle(reflector: Reflector, source: ScriptedSource) -> None:
    reflector.start()
    await asyncio.wait_for(source.idle.wait(), 2)
    await reflector.stop()


def contents(reflector: Reflector) -> dict[str, str]:
    """name -> resourceVersion of everything in the store."""
    store = reflector.informer.store
    return dict(
        projection.split("@") for ns in store.namespaces() for projection in store.in_namespace(ns)
    )


# -- the state machine, as scripts


async def test_list_then_watch_applies_events_and_resumes_from_bookmarks() -> None:
    source = ScriptedSource(
        lists=[([obj("a", "1"), obj("b", "2")], "10")],
        watches=[
            [
                event("ADDED", "c", "11"),
                event("MODIFIED", "a", "12"),
                event("DELETED", "b", "13"),
                event("BOOKMARK", "", "20"),
            ],  # the server ends this watch (timeoutSeconds): watch again from the bookmark
            [event("ADDED", "d", "21")],
        ],
    )
    recorder = Recorder()
    reflector = make(source, recorder)
    await run_until_idle(reflector, source)

    assert ["list", "watch 10", "watch 20", "watch 21"] == source.calls
    assert {"a": "12", "c": "11", "d": "21"} == contents(reflector)
    assert 1 == recorder.synced
    assert [] == recorder.sleeps
    assert [] == recorder.failures


async def test_paged_list_takes_the_resource_version_of_the_list() -> None:
    items = [obj(f"o{i}", str(i)) for i in range(5)]
    source = ScriptedSource(lists=[(items, "99")], watches=[])
    reflector = make(source, Recorder(), page_size=2)
    await run_until_idle(reflector, source)

    assert ["list", "list page-1", "list page-2", "watch 99"] == source.calls
    assert 5 == len(reflector.informer.store)


async def test_410_on_watch_relists_and_drops_ghosts() -> None:
    # client-go TestReflectorWatchListPageSize's cousin: a resourceVersion too old to watch
    # from means events were missed; only the LIST tells which objects are gone.
    source = ScriptedSource(
        lists=[([obj("a", "1"), obj("b", "2")], "10"), ([obj("b", "2"), obj("c", "15")], "16")],
        watches=[[StatusError(410, "Expired", "too old resource version")]],
    )
    recorder = Recorder()
    reflector = make(source, recorder)
    await run_until_idle(reflector, source)

    assert ["list", "watch 10", "list", "watch 16"] == source.calls
    assert {"b": "2", "c": "15"} == contents(reflector)
    # No progress since the LIST: the re-list waits for the back-off.
    assert [1.0] == recorder.sleeps
    assert 1 == recorder.synced, "on_synced is for the first LIST only"


async def test_410_error_event_after_progress_relists_at_once() -> None:
    source = ScriptedSource(
        lists=[([obj("a", "1")], "10"), ([], "30")],
        watches=[[event("ADDED", "b", "11"), error_event(410)]],
    )
    recorder = Recorder()
    reflector = make(source, recorder)
    await run_until_idle(reflector, source)

    assert ["list", "watch 10", "list", "watch 30"] == source.calls
    assert {} == contents(reflector)
    assert [] == recorder.sleeps


async def test_other_error_event_relists_after_backoff() -> None:
    source = ScriptedSource(
        lists=[([], "10"), ([], "11")],
        watches=[[error_event(500, "InternalError")]],
    )
    recorder = Recorder()
    reflector = make(source, recorder)
    await run_until_idle(reflector, source)

    assert ["list", "watch 10", "list", "watch 11"] == source.calls
    assert [1.0] == recorder.sleeps


async def test_connection_errors_back_off_and_resume_without_listing() -> None:
    source = ScriptedSource(
        lists=[([], "10")],
        watches=[
            [ConnectionResetError("reset")],
            [OSError("unreachable")],
            [event("ADDED", "a", "11"), TimeoutError()],  # progress resets the back-off
            [ValueError("malformed line")],
        ],
    )
    recorder = Recorder()
    reflector = make(source, recorder)
    await run_until_idle(reflector, source)

    assert ["list", "watch 10", "watch 10", "watch 10", "watch 11", "watch 11"] == source.calls
    assert [1.0, 2.0, 1.0, 2.0] == recorder.sleeps
    assert {"a": "11"} == contents(reflector)


async def test_failed_list_is_retried_after_backoff() -> None:
    source = ScriptedSource(
        lists=[StatusError(500, "InternalError"), ConnectionRefusedError(), ([obj("a", "1")], "5")],
        watches=[],
    )
    recorder = Recorder()
    reflector = make(source, recorder)
    await run_until_idle(reflector, source)

    assert ["list", "list", "list", "watch 5"] == source.calls
    assert [1.0, 2.0] == recorder.sleeps
    assert 1 == recorder.synced


async def test_lists_that_keep_failing_are_told_once_and_their_end_too() -> None:
    trouble: list[Exception | None] = []
    failing = [StatusError(500, "StorageReadError") for _ in range(4)]
    source = ScriptedSource(lists=[*failing, ([obj("a", "1")], "5")], watches=[])
    recorder = Recorder()
    reflector = make(source, recorder, on_list_trouble=trouble.append)
    await run_until_idle(reflector, source)

    # Told at the third failure in a row (not the fourth), and once the fifth LIST worked.
    assert [failing[2], None] == trouble
    assert 1 == recorder.synced


async def test_a_failed_list_or_two_is_not_trouble() -> None:
    trouble: list[Exception | None] = []
    source = ScriptedSource(
        lists=[StatusError(500, "InternalError"), StatusError(503, "x"), ([obj("a", "1")], "5")],
        watches=[],
    )
    reflector = make(source, Recorder(), on_list_trouble=trouble.append)
    await run_until_idle(reflector, source)
    assert [] == trouble


@pytest.mark.parametrize(
    ("lists", "watches", "calls"),
    [
        pytest.param([StatusError(403, "Forbidden")], [], ["list"], id="list forbidden"),
        pytest.param([StatusError(404, "NotFound")], [], ["list"], id="list not found"),
        pytest.param(
            [([], "1")], [[StatusError(404, "NotFound")]], ["list", "watch 1"],
            id="watch not found (CRD deleted)",
        ),
        pytest.param(
            [([], "1")], [[StatusError(405, "MethodNotAllowed")]], ["list", "watch 1"],
            id="watch not allowed",
        ),
    ],
)  # fmt: skip
async def test_forbidden_or_gone_stops_and_reports(
    lists: list[tuple[list[Obj], str] | Exception],
    watches: list[list[Obj | Exception]],
    calls: list[str],
) -> None:
    source = ScriptedSource(lists=lists, watches=watches)
    recorder = Recorder()
    reflector = make(source, recorder)
    reflector.start()
    for _ in range(20):
        await asyncio.sleep(0)
        if not reflector.running:
            break
    assert not reflector.running
    assert calls == source.calls
    assert 1 == len(recorder.failures)
    assert reflector.failure is recorder.failures[0]
    assert [] == recorder.sleeps
    await reflector.stop()


async def test_malformed_object_is_skipped_and_the_stream_goes_on() -> None:
    source = ScriptedSource(
        lists=[([], "1")],
        watches=[
            [
                {"type": "ADDED", "object": {"metadata": {"resourceVersion": "2"}}},
                {"type": "SOMETHING", "object": {"metadata": {"resourceVersion": "3"}}},
                event("ADDED", "a", "4"),
            ]
        ],
    )
    reflector = make(source, Recorder())
    await run_until_idle(reflector, source)

    assert ["list", "watch 1", "watch 4"] == source.calls
    assert {"a": "4"} == contents(reflector)


async def test_restart_lists_again_and_drops_what_was_deleted_meanwhile() -> None:
    source = ScriptedSource(
        lists=[([obj("a", "1"), obj("b", "2")], "10"), ([obj("b", "2")], "20")], watches=[]
    )
    recorder = Recorder()
    reflector = make(source, recorder)
    await run_until_idle(reflector, source)
    assert {"a": "1", "b": "2"} == contents(reflector)

    source.idle.clear()
    await run_until_idle(reflector, source)
    assert ["list", "watch 10", "list", "watch 20"] == source.calls
    assert {"b": "2"} == contents(reflector)


async def test_handlers_see_deletes_from_events_and_from_relists() -> None:
    source = ScriptedSource(
        lists=[([obj("a", "1"), obj("b", "2")], "10"), ([], "30")],
        watches=[[event("DELETED", "a", "11"), error_event(410)]],
    )
    reflector = make(source, Recorder())
    deleted: list[str] = []
    reflector.informer.add_handler(lambda c: deleted.append(c.name) if c.new is None else None)
    await run_until_idle(reflector, source)

    assert ["a", "b"] == deleted


# -- pieces


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        pytest.param(StatusError(410, "Gone"), "expired", id="410"),
        pytest.param(ErrorEvent(410, "Expired"), "expired", id="410 error event"),
        pytest.param(StatusError(403, "Forbidden"), "fatal", id="403"),
        pytest.param(StatusError(404, "NotFound"), "fatal", id="404"),
        pytest.param(StatusError(405, "MethodNotAllowed"), "fatal", id="405"),
        pytest.param(StatusError(401, "Unauthorized"), "transient", id="401 token rotation"),
        pytest.param(StatusError(429, "TooManyRequests"), "transient", id="429"),
        pytest.param(StatusError(500, "InternalError"), "transient", id="500"),
        pytest.param(ConnectionResetError(), "transient", id="connection reset"),
        pytest.param(TimeoutError(), "transient", id="timeout"),
        pytest.param(ValueError("bad json"), "transient", id="malformed"),
    ],
)
def test_classify(error: BaseException, outcome: str) -> None:
    assert outcome == classify(error)


def test_backoff_doubles_to_the_cap_and_resets() -> None:
    backoff = Backoff(1.0, 30.0)
    assert [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0] == [backoff.next() for _ in range(7)]
    backoff.reset()
    assert 1.0 == backoff.next()


@pytest.mark.parametrize(
    ("code", "body", "expected"),
    [
        pytest.param(
            410,
            '{"kind":"Status","code":410,"reason":"Expired","message":"too old"}',
            (410, "Expired", "too old"),
            id="status body",
        ),
        pytest.param(
            503,
            "upstream connect error",
            (503, "Service Unavailable", "upstream connect error"),
            id="not json",
        ),
        pytest.param(404, '{"kind":"Status"}', (404, "", ""), id="status without code"),
    ],
)
def test_status_error_from_body(code: int, body: str, expected: tuple[int, str, str]) -> None:
    error = _status_error_from_body(code, "Service Unavailable", body)
    assert expected == (error.code, error.reason, error.message)


def test_parse_event() -> None:
    assert {"type": "ADDED", "object": {}} == _parse_event(b'{"type":"ADDED","object":{}}')
    with pytest.raises(ValueError, match="not a JSON object"):
        _parse_event(b"[1]")
    with pytest.raises(json.JSONDecodeError):
        _parse_event(b"{truncated")
