"""tally as a subprocess that a test (or a benchmark) starts, stops and starts again.

The same command and environment shape as the ``operator`` fixture in ``conftest.py`` (``kopf
run operator/main.py --all-namespaces --standalone``, free ports for liveness, metrics and the
webhook), but owned by the caller: the restart and watch-loss tests stop tally in the middle of
a test, and ``bench/replenish.py`` runs it outside pytest. Standard library only.

``kubeconfig`` is what tally talks to (it may point at a proxy in front of the API server);
``admin_kubeconfig`` is the API server itself, used here only to see tally's webhook
configuration appear. On a graceful stop (SIGINT) tally removes that configuration (local
default ``TALLY_WEBHOOK_REMOVE_ON_EXIT=true``), so while tally is down creates are not charged.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import cluster

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
WEBHOOK_CONFIGURATION = "validatingwebhookconfiguration/tally.dev"


class OperatorError(RuntimeError):
    """tally did not start or stop as asked; the message carries the tail of its log."""


class TallyProcess:
    """One ``kopf run operator/main.py``; :meth:`start` again after :meth:`stop` restarts it.

    Every start appends to the same log file, so a failure shows the whole history.
    """

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        *,
        admin_kubeconfig: Path | None = None,
        bin_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.admin_kubeconfig = admin_kubeconfig or kubeconfig
        self.bin_dir = bin_dir or cluster.ensure_binaries()
        self.log = log
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_url = ""
        self.starts = 0

    # -- observing

    def log_text(self, tail: int = 60) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:])

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def webhook_registered(self) -> bool:
        result = subprocess.run(
            [
                str(self.bin_dir / "kubectl"),
                f"--kubeconfig={self.admin_kubeconfig}",
                "get",
                WEBHOOK_CONFIGURATION,
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        return result.returncode == 0

    # -- lifecycle

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start tally and return once it is live and its webhook configuration exists."""
        if self.running:
            raise OperatorError("tally is already running")
        port = cluster.free_port()
        liveness_url = f"http://127.0.0.1:{port}/healthz"
        metrics_port = cluster.free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "TALLY_METRICS_ADDR": "127.0.0.1",
            "TALLY_METRICS_PORT": str(metrics_port),
            "TALLY_WEBHOOK_PORT": str(cluster.free_port()),
            **self.extra_env,
        }
        command = [
            sys.executable, "-m", "kopf", "run", str(REPO / "operator" / "main.py"),
            "--all-namespaces", "--standalone", f"--liveness={liveness_url}",
        ]  # fmt: skip
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as sink:
            sink.write(f"\n===== start #{self.starts + 1} =====\n".encode())
            sink.flush()
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=sink)
        self.starts += 1
        deadline = time.monotonic() + timeout
        while not self._live(liveness_url):
            self._check_alive_before(deadline, "its liveness endpoint never answered")
            time.sleep(0.2)
        # Admission is on only once tally registered its webhook configuration.
        while not self.webhook_registered():
            self._check_alive_before(deadline, "it never registered its webhook")
            time.sleep(0.2)

    def _check_alive_before(self, deadline: float, what: str) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise OperatorError(f"tally exited with {self.process.returncode}:\n{self.log_text()}")
        if time.monotonic() > deadline:
            raise OperatorError(f"tally did not start: {what}:\n{self.log_text()}")

    @staticmethod
    def _live(url: str) -> bool:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url, timeout=2) as response,
        ):
            return bool(response.status == 200)
        return False

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """Graceful stop (SIGINT, what Ctrl-C sends); SIGKILL after ``timeout``.

        Returns the exit code; raises if tally had to be killed.
        """
        process = self.process
        if process is None:
            return 0
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise OperatorError(
                    f"tally did not stop within {timeout} s of SIGINT:\n{self.log_text()}"
                ) from None
        return process.returncode

    def kill(self) -> None:
        """Stop whatever runs, without waiting politely (for cleanup after a failure)."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
