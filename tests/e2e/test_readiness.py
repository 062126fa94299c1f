"""Readiness as the kubelet probes it: ``GET /readyz`` answers 200 only once the webhook serves
from synced caches, the start-up re-list of every kind is done, and the event loop has stayed
prompt for ``TALLY_READINESS_WINDOW`` seconds.

tally starts under its ServiceAccount beside the module's own tally (a webhook configuration of
its own), with a 3 s window, and both endpoints are polled from the spawn: readiness never
answers 200 before the webhook port accepts connections, nor within the window after it; it
answers 200 within a minute; a 503 says why (the re-list among them). The loop's lag is
exported as a histogram.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from operator_process import TallyProcess

from tally_e2e import ControlPlane

WINDOW_S: Final = 3.0
POLL_S: Final = 0.05
READY_WITHIN_S: Final = 60.0


@pytest.fixture
def starting(control_plane: ControlPlane, tmp_path: Path) -> Iterator[TallyProcess]:
    tally = TallyProcess(
        control_plane.kubeconfig,
        tmp_path / "tally.log",
        bin_dir=control_plane.bin_dir,
        env={
            "TALLY_READINESS_WINDOW": str(WINDOW_S),
            "TALLY_WEBHOOK_CONFIG_NAME": f"tally-ready-{uuid.uuid4().hex[:6]}.tally.dev",
        },
    )
    try:
        yield tally
    finally:
        tally.kill()
        control_plane.kubectl(
            "delete", tally.webhook_configuration, "--ignore-not-found", check=False
        )


def _readyz(url: str) -> tuple[int, str] | None:
    """(status, body), or None while nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()
    except OSError:
        return None


def test_ready_only_after_a_prompt_window_since_the_webhook_serves(
    starting: TallyProcess,
) -> None:
    starting.spawn()
    spawned = time.monotonic()
    # The webhook began to listen after the start of the last check that found it closed.
    closed_at = spawned
    listening = False
    unready: list[str] = []
    while True:
        assert time.monotonic() - spawned < READY_WITHIN_S, (
            f"not ready {READY_WITHIN_S:.0f} s after the spawn; last answers "
            f"{unready[-3:]}:\n{starting.log_text()}"
        )
        assert starting.running, starting.log_text()
        answer = _readyz(starting.readiness_url)
        answered_at = time.monotonic()
        if answer is not None and answer[0] == 200:
            break
        if answer is not None:
            assert 503 == answer[0], answer
            unready.append(answer[1])
        if not listening:
            checked = time.monotonic()
            if starting.webhook_listening():
                listening = True
            else:
                closed_at = checked
        time.sleep(POLL_S)
    assert "ok\n" == answer[1]
    assert listening or starting.webhook_listening(), "ready, and the webhook not listening"
    assert answered_at - closed_at >= WINDOW_S, (
        f"ready {answered_at - closed_at:.2f} s after the webhook was last seen closed"
    )
    assert unready, "no 503 was seen before the 200"
    assert all(body.startswith("starting: ") for body in unready), set(unready)
    # Once serving, the why is the window (or a late loop), not the caches.
    assert "caches are not synced" not in unready[-1], unready[-1]
    # Kopf's listings come after tally's LISTs: the one re-list of every kind ~30 s after the
    # start is waited out before the window (a replica ready sooner would take reviews into it).
    assert any("start-up re-list" in body for body in unready), set(unready)
    # A sample every 0.1 s: at least half the window's worth by now.
    assert starting.metric_sum("tally_event_loop_lag_seconds_count") >= WINDOW_S / 0.1 / 2
