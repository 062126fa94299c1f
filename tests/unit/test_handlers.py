"""tally.app.handlers: the Kopf registrations that NoEssenceDiffBase relies on."""

from __future__ import annotations

import logging

import kopf
import pytest

import tally.app.handlers as handlers

pytestmark = pytest.mark.unit


def test_no_change_or_spawning_handlers_are_registered() -> None:
    # Kopf's diff base is switched off (NoEssenceDiffBase): a create/update/resume/field
    # handler or a daemon/timer would see no changes, so none may exist.
    registry = kopf.get_default_registry()
    assert registry._watching.get_all_handlers()
    assert not registry._changing.get_all_handlers()
    assert not registry._spawning.get_all_handlers()


def test_the_diff_base_builds_nothing_and_refuses_to_store() -> None:
    storage = handlers.NoEssenceDiffBase()
    body = kopf.Body({"metadata": {"name": "p"}, "spec": {"a": 1}})
    assert storage.build(body=body) is None
    assert storage.fetch(body=body) is None
    with pytest.raises(RuntimeError, match="no change handlers"):
        storage.store(body=body, patch=kopf.Patch(), essence=kopf.BodyEssence())


def _record(message: str, *, exc_info: bool = False) -> logging.LogRecord:
    error = ValueError("boom")
    return logging.LogRecord(
        "kopf.objects", logging.ERROR, __file__, 1, message, None,
        (type(error), error, None) if exc_info else None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("message", "exc_info", "kept"),
    [
        pytest.param(
            "Webhook 'quota' failed permanently: exceeded quota: q, requested: pods=1, "
            "used: pods=5, limited: pods=5",
            False, False, id="quota-refusal",
        ),
        pytest.param(
            "Webhook 'validate-podsets' failed permanently: PodSet.tally.dev \"web\" is invalid: …",
            False, False, id="podset-refusal",
        ),
        pytest.param(
            "Webhook 'quota' failed with an exception and will stop now: boom",
            True, True, id="unexpected-exception",
        ),
        pytest.param(
            "Webhook 'other' failed permanently: not ours", False, True, id="another-webhook",
        ),
        pytest.param(
            "Handler 'cache-pods' failed permanently: x", False, True, id="an-event-handler",
        ),
    ],
)  # fmt: skip
def test_only_tallys_deliberate_refusals_leave_kopfs_log(
    message: str, exc_info: bool, kept: bool
) -> None:
    # Kopf logs every kopf.AdmissionError at ERROR: one line per create a full namespace
    # refuses. Those lines go; everything else Kopf logs about handlers stays.
    assert kept is handlers._RefusalsFilter().filter(_record(message, exc_info=exc_info))
