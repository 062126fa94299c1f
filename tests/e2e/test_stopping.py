"""A stop ends in seconds, even when the API server does not answer.

A pod gets SIGTERM and, once its termination grace (the Deployment's 30 s, 5 of them the
preStop sleep) is over, SIGKILL. A tally that waits on an API server that does not answer (a
partition, a control plane restarting) for each of its last requests (the webhook
configuration removed, the Lease released, the last Events) used to wait out a minute per
request, and Kopf then retried its failed clean-up a minute later: it was killed, not stopped.

On a control plane of its own (its kube-apiserver is frozen mid-test), tally runs as the
Deployment runs it (leader election, under its ServiceAccount) and, for the worst case, also
removes its webhook configuration on exit (the local default). kube-apiserver gets SIGSTOP:
connections to it neither answer nor fail, as behind a partition. Then tally gets SIGTERM and
must have exited within ``STOP_BOUND_S``. The control: with the API server answering, the same
stop releases the Lease and removes the configuration, and takes far less.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from operator_process import TallyProcess

import cluster
from tally.app.runtime import STOP_TIMEOUT_S

STOP_BOUND_S: Final = STOP_TIMEOUT_S + 5.0
"""tally's own bound on waiting for others, then 5 s for cutting the rest (the clean-up
handler allows 2 s) and for Kopf's and Python's own teardown."""
GRACEFUL_BOUND_S: Final = 3.0


@pytest.fixture(scope="module")
def own_plane() -> Iterator[cluster.State]:
    directory = Path(tempfile.mkdtemp(prefix="tally-e2e-stopping-"))
    try:
        with cluster.running(directory, "operator") as state:
            yield state
    finally:
        cluster.down(directory, clean=True, quiet=True)


def _tally(plane: cluster.State, log: Path) -> TallyProcess:
    return TallyProcess(
        Path(plane.kubeconfig),
        log,
        bin_dir=Path(plane.bin_dir),
        env={"TALLY_LEADER_ELECTION": "true", "TALLY_WEBHOOK_REMOVE_ON_EXIT": "true"},
    )


def _sigterm(tally: TallyProcess) -> float:
    """SIGTERM, then the seconds until the process exited (pytest.fail past a minute)."""
    assert tally.process is not None
    started = time.monotonic()
    tally.process.send_signal(signal.SIGTERM)
    try:
        tally.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        tally.process.kill()
        pytest.fail(f"tally still ran a minute after SIGTERM:\n{tally.log_text()}")
    assert tally.process.returncode == 0, tally.log_text()
    return time.monotonic() - started


def test_a_stop_with_the_api_server_answering_lets_go_of_everything(
    own_plane: cluster.State, tmp_path: Path
) -> None:
    tally = _tally(own_plane, tmp_path / "tally.log")
    try:
        tally.start()
        took = _sigterm(tally)
    finally:
        tally.kill()
    log = tally.log_text(tail=10_000)
    assert "released lease tally-system/tally" in log
    assert "webhook tally.dev removed" in log
    assert not tally.webhook_registered()
    assert took < GRACEFUL_BOUND_S, f"{took:.1f} s"


def test_a_stop_with_the_api_server_frozen_ends_in_seconds(
    own_plane: cluster.State, tmp_path: Path
) -> None:
    tally = _tally(own_plane, tmp_path / "tally.log")
    apiserver = own_plane.pids["kube-apiserver"]
    try:
        tally.start()
        os.kill(apiserver, signal.SIGSTOP)
        try:
            took = _sigterm(tally)
        finally:
            os.kill(apiserver, signal.SIGCONT)
    finally:
        tally.kill()
        subprocess.run(
            [str(Path(own_plane.bin_dir) / "kubectl"), f"--kubeconfig={own_plane.kubeconfig}",
             "delete", tally.webhook_configuration, "--ignore-not-found"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    print(f"exited {took:.1f} s after SIGTERM with the API server frozen")
    log = tally.log_text(tail=10_000)
    assert took < STOP_BOUND_S, f"{took:.1f} s:\n{log}"
    # It said what it could not do, and it did not fail its clean-up (which Kopf would retry).
    assert "could not release lease tally-system/tally" in log
    assert "webhook tally.dev not removed" in log
    assert "Activity 'stop' succeeded" in log
