"""tally as a subprocess that a test (or a benchmark) starts, stops and starts again.

The same command and environment shape as the ``operator`` fixture in ``conftest.py`` (``kopf
run operator/main.py --all-namespaces --standalone``, free ports for liveness, metrics and the
webhook), but owned by the caller: the restart and watch-loss tests stop tally in the middle of
a test, and ``bench/replenish.py`` runs it outside pytest. Standard library only.

``kubeconfig`` is what tally talks to (it may point at a proxy in front of the API server);
``admin_kubeconfig`` is the API server itself, used here to see tally's webhook configuration
appear and to find the CA of the client certificate the API server presents to webhooks: tally
runs with mutual TLS (``TALLY_WEBHOOK_CLIENT_CA``) unless ``env`` says otherwise. On a graceful
stop (SIGINT) tally removes its configuration (local default
``TALLY_WEBHOOK_REMOVE_ON_EXIT=true``), so while tally is down creates are not charged.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import cluster

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
WEBHOOK_CONFIGURATION = "validatingwebhookconfiguration/tally.dev"


def established_connections(pid: int | str, remote_port: int) -> set[str]:
    """The ESTABLISHED TCP connections of process ``pid`` (``"self"``: this one) whose remote
    port is ``remote_port``, by socket inode: matched against its own file descriptors, since
    the tables of ``/proc/<pid>/net`` list the whole network namespace."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and port == remote_port and fields[9] in inodes:
                found.add(fields[9])
    return found


def webhook_ports(bin_dir: Path, kubeconfig: Path, configuration: str) -> set[int] | None:
    """The ports a webhook configuration sends reviews to; None when it does not exist.

    A tally that was killed (or told to keep its configuration on exit) leaves its
    configuration behind, pointing at a port nobody serves any more: a new tally is ready
    only once the configuration points at *its* port, not merely once one exists.
    """
    result = subprocess.run(
        [str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", "get", configuration, "-ojson"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        return None
    ports: set[int] = set()
    for webhook in json.loads(result.stdout).get("webhooks") or []:
        client_config = webhook.get("clientConfig") or {}
        if "url" in client_config:
            ports.add(urllib.parse.urlsplit(client_config["url"]).port or 443)
        else:
            ports.add(int((client_config.get("service") or {}).get("port", 443)))
    return ports


def mutual_tls_env(admin_kubeconfig: Path) -> dict[str, str]:
    """The setting that makes tally's webhook require the client certificate the API server
    of this control plane presents (``hack/cluster.py``, operator mode): the e2e suite runs
    tally with mutual TLS, as a cluster should. Nothing for a reference-mode control plane,
    whose API server presents none."""
    pki = cluster.webhook_client_pki(admin_kubeconfig.parent)
    return {} if pki is None else {"TALLY_WEBHOOK_CLIENT_CA": str(pki.ca)}


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
        interpreter_args: Sequence[str] = (),
        entry_point: Path = REPO / "operator" / "main.py",
    ) -> None:
        """``entry_point``: the file ``kopf run`` loads (a test harness may wrap the operator's)."""
        self.entry_point = entry_point
        self.kubeconfig = kubeconfig
        # Between ``python`` and ``-m kopf``: ``-m cProfile -o FILE`` profiles tally (the
        # profile is written on a graceful stop).
        self.interpreter_args = tuple(interpreter_args)
        self.admin_kubeconfig = admin_kubeconfig or kubeconfig
        self.bin_dir = bin_dir or cluster.ensure_binaries()
        self.log = log
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_url = ""
        self.webhook_port = 0
        self.starts = 0

    # -- observing

    def metric_sum(self, name: str) -> float:
        """The sum of every sample of ``name`` (all label sets) on the process's /metrics."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            text = response.read().decode()
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith((name + "{", name + " "))
        )

    def log_text(self, tail: int = 60) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:])

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def webhook_configuration(self) -> str:
        name = self.extra_env.get("TALLY_WEBHOOK_CONFIG_NAME")
        return f"validatingwebhookconfiguration/{name}" if name else WEBHOOK_CONFIGURATION

    def webhook_registered(self) -> bool:
        """Whether tally's webhook configuration exists (whichever process registered it)."""
        ports = webhook_ports(self.bin_dir, self.admin_kubeconfig, self.webhook_configuration)
        return ports is not None

    def webhook_serving(self) -> bool:
        """Whether the configuration sends every review to this process's webhook port."""
        ports = webhook_ports(self.bin_dir, self.admin_kubeconfig, self.webhook_configuration)
        return ports == {self.webhook_port}

    # -- lifecycle

    def webhook_listening(self) -> bool:
        """Whether this process's webhook port accepts connections (the Deployment's readiness
        probe: Kopf opens it only after tally's caches are synced)."""
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.webhook_port), timeout=1),
        ):
            return True
        return False

    def start(self, timeout: float = START_TIMEOUT_S, *, registered: bool = True) -> None:
        """Start tally; return once it is live and its webhook configuration points at it
        (``registered``), or only once its webhook serves (``registered=False``: a replica
        that is not the leader serves its webhook but registers nothing)."""
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
            **mutual_tls_env(self.admin_kubeconfig),
            **self.extra_env,
        }
        self.webhook_port = int(env["TALLY_WEBHOOK_PORT"])
        command = [
            sys.executable, *self.interpreter_args,
            "-m", "kopf", "run", str(self.entry_point),
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
        if env.get("TALLY_WEBHOOK_ENABLED", "true").lower() == "false":
            return  # no webhook to wait for: live is all there is
        if not registered:
            while not self.webhook_listening():
                self._check_alive_before(deadline, "its webhook never served")
                time.sleep(0.2)
            return
        # Admission is on only once tally registered its webhook configuration.
        while not self.webhook_serving():
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
