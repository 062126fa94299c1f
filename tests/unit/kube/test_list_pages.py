"""tally.kube.rest.list_pages: a paged LIST whose next page is asked for while the caller
handles this one, and whose request still out is cancelled when the caller stops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tally.kube import rest

pytestmark = pytest.mark.unit


class Pages:
    """``rest.get_json`` answering a LIST of three pages (tokens "2", "3", then none); each
    answer waits for its ``release`` event, so the test decides when the API server answers."""

    def __init__(self) -> None:
        self.asked: list[list[tuple[str, str]]] = []
        self.release = {token: asyncio.Event() for token in ("", "2", "3")}
        self.cancelled: list[str] = []

    async def __call__(self, api: object, path: str, query: list[tuple[str, str]]) -> Any:
        assert "/api/v1/namespaces/a/pods" == path
        self.asked.append(query)
        token = dict(query).get("continue", "")
        try:
            await self.release[token].wait()
        except asyncio.CancelledError:
            self.cancelled.append(token)
            raise
        following = {"": "2", "2": "3", "3": ""}[token]
        return {"metadata": {"continue": following},
                "items": [{"metadata": {"name": f"page{token or '1'}"}}]}  # fmt: skip


def listing(monkeypatch: pytest.MonkeyPatch) -> tuple[Pages, AsyncIterator[list[Any]]]:
    """The pods of namespace "a", two a page, from :class:`Pages`."""
    pages = Pages()
    monkeypatch.setattr(rest, "get_json", pages)
    api: Any = object()  # never used: every request goes to Pages
    return pages, rest.list_pages(api, "", "v1", "pods", namespace="a", page_size=2)


async def test_the_next_page_is_asked_for_before_this_one_is_handed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pages, listed = listing(monkeypatch)
    for event in pages.release.values():
        event.set()
    first = await anext(listed)
    assert [{"metadata": {"name": "page1"}}] == first
    # Page 2 was asked for (with page 1's token) before page 1 reached the caller.
    await asyncio.sleep(0)
    assert [[("limit", "2")], [("limit", "2"), ("continue", "2")]] == pages.asked
    rest_of_it = [[o["metadata"]["name"] for o in page] async for page in listed]
    assert [["page2"], ["page3"]] == rest_of_it
    assert 3 == len(pages.asked)  # no page asked for after the last


async def test_a_caller_that_stops_early_cancels_the_request_still_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pages, listed = listing(monkeypatch)
    pages.release[""].set()
    await anext(listed)
    await asyncio.sleep(0)
    assert 2 == len(pages.asked)  # page 2 is out, not answered
    await listed.aclose()  # type: ignore[attr-defined]
    assert ["2"] == pages.cancelled
