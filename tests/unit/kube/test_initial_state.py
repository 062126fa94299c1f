"""tally.kube.rest.initial_state: a watch's initial state read from the bytes of its stream, as
the API server sends it with ``sendInitialEvents`` (one JSON event a line, ADDED for each
object, a bookmark annotated ``k8s.io/initial-events-end`` after the last)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from tally.kube import rest

pytestmark = pytest.mark.unit

PATH = "/api/v1/pods"


def added(name: str, **data: str) -> dict[str, Any]:
    return {"type": "ADDED", "object": {"metadata": {"name": name}, "data": data}}


def bookmark(*, end: bool) -> dict[str, Any]:
    annotations = {"k8s.io/initial-events-end": "true"} if end else {}
    metadata = {"resourceVersion": "9", "annotations": annotations}
    return {"type": "BOOKMARK", "object": {"metadata": metadata}}


def stream_of(events: list[Any]) -> bytes:
    return b"".join(json.dumps(event).encode() + b"\n" for event in events)


class Chunks:
    """The stream's bytes in pieces of ``size``; counts the pieces read."""

    def __init__(self, data: bytes, size: int) -> None:
        self.pieces = [data[i : i + size] for i in range(0, len(data), size)]
        self.read = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            self.read += 1
            yield piece


async def names(chunks: Chunks, batch: int) -> list[list[str]]:
    return [
        [obj["metadata"]["name"] for obj in items]
        async for items in rest.initial_state(chunks, PATH, batch=batch)
    ]


@pytest.mark.parametrize("size", [1, 7, 64, 1 << 20])
async def test_objects_arrive_whole_and_in_order_however_the_lines_are_cut(size: int) -> None:
    big = "x" * 5000  # a line far longer than most pieces
    events = [added("a"), added("b", big=big), bookmark(end=False), added("c"), added("d"),
              added("e"), bookmark(end=True)]  # fmt: skip
    chunks = Chunks(stream_of(events), size)
    batches = [items async for items in rest.initial_state(chunks, PATH, batch=2)]
    listed = [obj for items in batches for obj in items]
    assert [e["object"] for e in events if e["type"] == "ADDED"] == listed
    # A batch is handed over once it holds at least 2 objects, at the end of a piece.
    assert all(len(items) >= 2 for items in batches[:-1])


async def test_the_end_bookmark_ends_the_list_and_nothing_after_it_is_read() -> None:
    head = stream_of([added("a"), bookmark(end=True)])
    tail = stream_of([{"type": "MODIFIED", "object": {"metadata": {"name": "a"}}}])
    chunks = Chunks(head + tail, len(head))
    assert [["a"]] == await names(chunks, batch=500)
    assert 1 == chunks.read  # the watch's later events are not the list's


async def test_an_empty_kind_lists_as_no_batch() -> None:
    assert [] == await names(Chunks(stream_of([bookmark(end=True)]), 100), batch=500)


async def test_blank_lines_between_events_are_no_events() -> None:
    data = b"\n" + stream_of([added("a")]) + b"\n\n" + stream_of([bookmark(end=True)])
    assert [["a"]] == await names(Chunks(data, 3), batch=500)


async def test_a_stream_that_ends_before_the_end_bookmark_fails() -> None:
    chunks = Chunks(stream_of([added("a"), added("b"), bookmark(end=False)]), 10)
    with pytest.raises(client.ApiException, match="ended before the initial state"):
        await names(chunks, batch=500)


async def test_an_error_event_raises_its_status() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                        "message": "too old resource version: 5 (9)"}}  # fmt: skip
    with pytest.raises(client.ApiException) as raised:
        await names(Chunks(stream_of([added("a"), gone]), 100), batch=500)
    assert 410 == raised.value.status
    assert "too old resource version" in str(raised.value.reason)


@pytest.mark.parametrize(
    "line",
    [
        b'{"type": "MODIFIED", "object": {"metadata": {"name": "a"}}}',
        b'{"type": "DELETED", "object": {"metadata": {"name": "a"}}}',
        b'{"type": "ADDED", "object": "a"}',
        b'["ADDED"]',
        b'{"type": "ERROR", "object": {"code": "410"}}',
        b'{"type": "ADDED", "object": {"metadata"',
    ],
    ids=[
        "modified",
        "deleted",
        "object-no-mapping",
        "event-no-mapping",
        "error-code-no-number",
        "cut-json",
    ],
)
async def test_a_line_that_is_not_the_protocol_fails_the_list(line: bytes) -> None:
    data = stream_of([added("a")]) + line + b"\n" + stream_of([bookmark(end=True)])
    with pytest.raises(client.ApiException) as raised:
        await names(Chunks(data, 100), batch=500)
    assert PATH in str(raised.value.reason)
    assert 410 != raised.value.status  # nothing there said the state was gone
