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
