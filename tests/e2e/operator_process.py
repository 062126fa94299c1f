"""tally as a subprocess that a test (or a benchmark) starts, stops and starts again, as it is
deployed: under its ServiceAccount's RBAC.

The same command and environment shape as the Deployment in ``manifests/`` (``kopf run
operator/main.py --all-namespaces --standalone``, free ports for liveness, metrics and the
webhook, ``TALLY_NAMESPACE=tally-system``), owned by the caller: the restart and watch-loss
tests stop tally in the middle of a test, and the benchmarks run it outside pytest.

**Credentials.** tally talks to the API server with a token of the ServiceAccount
``tally-system/tally`` (TokenRequest, ``kubectl create token``), bound by the RBAC objects of
``manifests/`` (:func:`grant`, applied before every start), never as an administrator: a right
the shipped roles lack fails here as it would in a cluster. Where a test changes a setting that
the roles name (``TALLY_NAMESPACE``, ``TALLY_WEBHOOK_CERT_SECRET``, ``TALLY_WEBHOOK_CONFIG_NAME``,
``TALLY_LEADER_ELECTION_LEASE``), the same rules are granted for the names it chose, as an
installer changing that setting must do. ``credentials="kubeconfig"`` runs tally with the
kubeconfig's own user: only for tests about RBAC itself.

``kubeconfig`` is where tally connects (it may point at a proxy in front of the API server; its
server and CA are kept, its user is replaced by the token); ``admin_kubeconfig`` is the API
server itself, used here to grant the roles, request the token, see tally's webhook
configuration appear and find the CA of the client certificate the API server presents to
webhooks: tally runs with mutual TLS (``TALLY_WEBHOOK_CLIENT_CA``) unless ``env`` says
otherwise. On a graceful stop (SIGINT) tally removes its configuration (local default
``TALLY_WEBHOOK_REMOVE_ON_EXIT=true``), so while tally is down creates are not charged.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

import cluster

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
WEBHOOK_CONFIGURATION = "validatingwebhookconfiguration/tally.dev"
MANIFESTS = REPO / "manifests"
OWN_NAMESPACE = "tally-system"
"""tally's namespace in ``manifests/``: its ServiceAccount, Roles, Lease, certificate Secret."""
SERVICE_ACCOUNT = "tally"
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{OWN_NAMESPACE}:{SERVICE_ACCOUNT}"
RBAC_KINDS = frozenset(
    {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
# The names the manifests' roles grant, and the settings that choose them.
DEFAULT_NAMES = {
    "TALLY_WEBHOOK_CONFIG_NAME": "tally.dev",
    "TALLY_WEBHOOK_CERT_SECRET": f"{OWN_NAMESPACE}/tally-webhook-tls",
    "TALLY_LEADER_ELECTION_LEASE": "tally",
}
TOKEN_DURATION = "24h"
FORBIDDEN = re.compile(rf'forbidden: User \\?"{re.escape(SERVICE_ACCOUNT_USER)}\\?" cannot')
"""How the API server's refusal of one of tally's requests for want of a right shows in tally's
log: its message (in kubernetes-asyncio's exception text, the body's JSON escapes the quotes).
Other 403s (a namespace being deleted, a webhook's refusal) are not RBAC's."""
GRANT_TIMEOUT_S = 30.0
GRANT_ATTEMPTS = 5
_GRANTING = threading.Lock()
"""One grant at a time in this process (the soak starts its replicas together)."""


def established_connections(
    pid: int | str, remote_port: int | None = None, *, local_port: int | None = None
) -> set[str]:
    """The ESTABLISHED TCP connections of process ``pid`` (``"self"``: this one) whose remote
    port is ``remote_port`` (or whose local port is ``local_port``: those a server accepted),
    by socket inode: matched against its own file descriptors, since the tables of
    ``/proc/<pid>/net`` list the whole network namespace."""
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
            local = int(fields[1].rsplit(":", 1)[1], 16)
            port = int(fields[2].rsplit(":", 1)[1], 16)
            wanted = port == remote_port if local_port is None else local == local_port
            if fields[3] == "01" and wanted and fields[9] in inodes:
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


def _kubectl(
    bin_dir: Path, kubeconfig: Path, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise OperatorError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result


def manifests_rbac(bin_dir: Path) -> list[dict[str, Any]]:
    """tally's Namespace, ServiceAccount and every role and binding ``kubectl apply -k
    manifests/`` installs, as rendered (``kubectl kustomize``)."""
    rendered = _kubectl(bin_dir, Path(os.devnull), "kustomize", str(MANIFESTS)).stdout
    return [o for o in yaml.safe_load_all(rendered) if o and o["kind"] in RBAC_KINDS]


def rbac_for(objects: Sequence[Mapping[str, Any]], env: Mapping[str, str]) -> list[dict[str, Any]]:
    """The manifests' RBAC ``objects`` plus the same rules for the names ``env`` chooses
    instead of the manifests' (what an installer changing those settings must grant).

    * ``TALLY_NAMESPACE`` elsewhere: the manifests' Roles (the Lease, the certificate Secret,
      the built-in quota probe) in that namespace too, bound to the same ServiceAccount.
    * ``TALLY_WEBHOOK_CERT_SECRET`` / ``TALLY_LEADER_ELECTION_LEASE`` renamed: the rules naming
      the manifests' Secret / Lease name the chosen one (in the Secret's namespace).
    * ``TALLY_WEBHOOK_CONFIG_NAME`` renamed: a ClusterRole of its own with the ClusterRole's
      rules that name the configuration, naming the chosen one.
    """
    result: list[dict[str, Any]] = json.loads(json.dumps(list(objects)))
    own = env.get("TALLY_NAMESPACE", OWN_NAMESPACE)
    secret_ns, _, secret = env.get(
        "TALLY_WEBHOOK_CERT_SECRET", DEFAULT_NAMES["TALLY_WEBHOOK_CERT_SECRET"]
    ).partition("/")
    lease = env.get("TALLY_LEADER_ELECTION_LEASE", DEFAULT_NAMES["TALLY_LEADER_ELECTION_LEASE"])
    renamed = {
        "tally-webhook-tls": secret,
        DEFAULT_NAMES["TALLY_LEADER_ELECTION_LEASE"]: lease,
    }
    extra: list[dict[str, Any]] = []
    for obj in result:
        if obj["kind"] not in ("Role", "RoleBinding"):
            continue
        name = obj["metadata"]["name"]
        namespaces = {own, secret_ns} if name == "tally-webhook-tls" else {own}
        for namespace in sorted(namespaces - {OWN_NAMESPACE}):
            copy = json.loads(json.dumps(obj))
            copy["metadata"]["namespace"] = namespace
            extra.append(copy)
    for obj in [*result, *extra]:
        if obj["kind"] != "Role":
            continue
        for rule in obj["rules"]:
            if rule.get("resourceNames"):
                rule["resourceNames"] = [renamed.get(n, n) for n in rule["resourceNames"]]
    configuration = env.get("TALLY_WEBHOOK_CONFIG_NAME", DEFAULT_NAMES["TALLY_WEBHOOK_CONFIG_NAME"])
    if configuration != DEFAULT_NAMES["TALLY_WEBHOOK_CONFIG_NAME"]:
        (role,) = (
            o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "tally"
        )
        name = f"tally-e2e-{configuration}"
        extra.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": [
                    {**rule, "resourceNames": [configuration]}
                    for rule in role["rules"]
                    if DEFAULT_NAMES["TALLY_WEBHOOK_CONFIG_NAME"] in rule.get("resourceNames", ())
                ],
            }
        )
        extra.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": OWN_NAMESPACE}
                ],
            }
        )
    return [*result, *extra]


def grant(admin_kubeconfig: Path, bin_dir: Path, env: Mapping[str, str]) -> None:
    """Apply the manifests' RBAC (:func:`rbac_for` ``env``) and wait until the API server's
    authorizer, which follows roles through an informer, lets the ServiceAccount act."""
    objects = rbac_for(manifests_rbac(bin_dir), env)
    with _GRANTING:
        for attempt in range(GRANT_ATTEMPTS):
            try:
                _kubectl(
                    bin_dir, admin_kubeconfig, "apply", "-f", "-",
                    input=yaml.safe_dump_all(objects),
                )  # fmt: skip
                break
            except OperatorError as error:
                # Another process applying the same objects at the same moment (kubectl apply
                # reads, then creates): the next apply finds them and patches.
                racing = "AlreadyExists" in str(error) or "Conflict" in str(error)
                if not racing or attempt == GRANT_ATTEMPTS - 1:
                    raise
                time.sleep(0.5)
    checks = [("list", "pods", "--all-namespaces")]
    own = env.get("TALLY_NAMESPACE", OWN_NAMESPACE)
    checks.append(("create", "leases.coordination.k8s.io", f"--namespace={own}"))
    deadline = time.monotonic() + GRANT_TIMEOUT_S
    for check in checks:
        while True:
            result = subprocess.run(
                [str(bin_dir / "kubectl"), f"--kubeconfig={admin_kubeconfig}", "auth", "can-i",
                 *check, f"--as={SERVICE_ACCOUNT_USER}"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if result.stdout.strip() == "yes":
                break
            if time.monotonic() > deadline:
                raise OperatorError(f"{SERVICE_ACCOUNT_USER} was never allowed to {check}")
            time.sleep(0.2)


def revoke_cluster_roles(admin_kubeconfig: Path, bin_dir: Path) -> None:
    """Delete the cluster-wide roles and bindings :func:`grant` applies (the manifests' and
    the renamed ones), for a test that installs tally's own (a Helm release cannot take over
    objects it did not create). The next :func:`grant` applies them again."""
    names = {
        (o["kind"], o["metadata"]["name"])
        for o in manifests_rbac(bin_dir)
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding")
    }
    listed = _kubectl(
        bin_dir, admin_kubeconfig, "get", "clusterroles,clusterrolebindings", "-o", "name"
    ).stdout.split()
    for item in listed:
        kind, _, name = item.partition("/")
        if name.startswith("tally-e2e-"):
            names.add(
                ("ClusterRole" if kind.startswith("clusterrole.") else "ClusterRoleBinding", name)
            )
    for kind, name in sorted(names):
        _kubectl(bin_dir, admin_kubeconfig, "delete", kind.lower(), name, "--ignore-not-found")


def service_account_kubeconfig(
    kubeconfig: Path, admin_kubeconfig: Path, bin_dir: Path, path: Path
) -> Path:
    """``kubeconfig`` (its server and CA) with a fresh token of tally's ServiceAccount as its
    only user, written to ``path``. Fresh every time: a token names the ServiceAccount's uid,
    so one issued before the account was deleted and created again is refused."""
    token = _kubectl(
        bin_dir, admin_kubeconfig, "create", "token", SERVICE_ACCOUNT,
        f"--namespace={OWN_NAMESPACE}", f"--duration={TOKEN_DURATION}",
    ).stdout.strip()  # fmt: skip
    source = yaml.safe_load(kubeconfig.read_text())
    current = source.get("current-context")
    contexts = {c["name"]: c["context"] for c in source["contexts"]}
    cluster_name = (contexts[current] if current else next(iter(contexts.values())))["cluster"]
    (cluster_entry,) = (c["cluster"] for c in source["clusters"] if c["name"] == cluster_name)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster_entry}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [
            {"name": SERVICE_ACCOUNT, "context": {"cluster": "cluster", "user": SERVICE_ACCOUNT}}
        ],
        "current-context": SERVICE_ACCOUNT,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


class OperatorError(RuntimeError):
    """tally did not start or stop as asked; the message carries the tail of its log."""


class TallyProcess:
    """One ``kopf run operator/main.py``; :meth:`start` again after :meth:`stop` restarts it.

    The one place tests, benchmarks and ``hack/conformance.py`` start tally (``hack/run.py``,
    the developer's foreground ``make run``, runs its own). Every start appends to the same log
    file, so a failure shows the whole history.
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
        credentials: Literal["service-account", "kubeconfig"] = "service-account",
        new_session: bool = False,
    ) -> None:
        """``entry_point``: the file ``kopf run`` loads (a test harness may wrap the operator's).
        ``credentials``: ``"service-account"`` (tally's token under the manifests' RBAC, the
        way it is deployed) or ``"kubeconfig"`` (``kubeconfig``'s own user, as given: tests
        about RBAC itself only). ``new_session``: tally in a session (and process group) of its
        own, without stdin, so that a Ctrl-C in the terminal reaches only the caller, which
        stops tally in its own time; :meth:`stop` and :meth:`kill` then signal the group."""
        self.entry_point = entry_point
        self.new_session = new_session
        self.kubeconfig = kubeconfig
        self.credentials = credentials
        # Between ``python`` and ``-m kopf``: ``-m cProfile -o FILE`` profiles tally (the
        # profile is written on a graceful stop).
        self.interpreter_args = tuple(interpreter_args)
        self.admin_kubeconfig = admin_kubeconfig or kubeconfig
        self.bin_dir = bin_dir or cluster.ensure_binaries()
        self.log = log
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_url = ""
        self.liveness_url = ""
        self.readiness_url = ""
        self.webhook_port = 0
        self.starts = 0
        self._token_kubeconfig: Path | None = None
        self._webhook_enabled = True

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

    def refused_by_rbac(self) -> list[str]:
        """Where tally's log shows the API server refusing tally a request for want of a right
        (the line, with the next): a rule the shipped roles lack, unless the test took it away.
        """
        text = self.log_text(tail=1_000_000)
        found = []
        for match in FORBIDDEN.finditer(text):
            start = text.rfind("\n", 0, match.start()) + 1
            end = text.find("\n", match.end())
            found.append(text[start : end if end >= 0 else None])
        return found

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
        probe: tally's webhook server opens it only after the caches are synced), at the
        address it listens on (``TALLY_WEBHOOK_ADDR``, loopback unless the test says)."""
        host = self.extra_env.get("TALLY_WEBHOOK_ADDR", "127.0.0.1")
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        with (
            contextlib.suppress(OSError),
            socket.create_connection((host, self.webhook_port), timeout=1),
        ):
            return True
        return False

    def live(self) -> bool:
        """Whether this process's liveness endpoint answers 200."""
        return bool(self.liveness_url) and self._live(self.liveness_url)

    def ready(self) -> bool:
        """Whether this process's readiness endpoint answers 200 (``tally.app.readiness``)."""
        return bool(self.readiness_url) and self._live(self.readiness_url)

    def prepare(self) -> Path:
        """The kubeconfig tally runs with. With the ServiceAccount's credentials, the first
        call grants the manifests' RBAC and writes a token's kubeconfig; later calls (a
        restart: the soak restarts replicas while the API server may be down) reuse it, as a
        restarted container keeps its pod's token. :meth:`spawn` calls it; a benchmark that
        times tally's start from the spawn calls it first."""
        if self.credentials != "service-account":
            return self.kubeconfig
        if self._token_kubeconfig is None:
            settings = {"TALLY_NAMESPACE": OWN_NAMESPACE, **self.extra_env}
            grant(self.admin_kubeconfig, self.bin_dir, settings)
            self._token_kubeconfig = service_account_kubeconfig(
                self.kubeconfig, self.admin_kubeconfig, self.bin_dir,
                self.log.parent / f"{self.log.stem}.kubeconfig",
            )  # fmt: skip
        return self._token_kubeconfig

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start tally and return at once, without waiting for anything (:meth:`start` waits
        until it is ready)."""
        if self.running:
            raise OperatorError("tally is already running")
        port = cluster.free_port()
        liveness_url = f"http://127.0.0.1:{port}/healthz"
        self.liveness_url = liveness_url
        metrics_port = cluster.free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        readiness_port = cluster.free_port()
        self.readiness_url = f"http://127.0.0.1:{readiness_port}/readyz"
        settings = {"TALLY_NAMESPACE": OWN_NAMESPACE, **self.extra_env}
        kubeconfig = self.prepare()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "TALLY_METRICS_ADDR": "127.0.0.1",
            "TALLY_METRICS_PORT": str(metrics_port),
            "TALLY_READINESS_ADDR": "127.0.0.1",
            "TALLY_READINESS_PORT": str(readiness_port),
            "TALLY_WEBHOOK_PORT": str(cluster.free_port()),
            **mutual_tls_env(self.admin_kubeconfig),
            **settings,
        }
        self.webhook_port = int(env["TALLY_WEBHOOK_PORT"])
        self._webhook_enabled = env.get("TALLY_WEBHOOK_ENABLED", "true").lower() != "false"
        command = [
            sys.executable, *self.interpreter_args,
            "-m", "kopf", "run", str(self.entry_point),
            "--all-namespaces", "--standalone", f"--liveness={liveness_url}",
        ]  # fmt: skip
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as sink:
            sink.write(f"\n===== start #{self.starts + 1} =====\n".encode())
            sink.flush()
            self.process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=sink, stderr=sink,
                stdin=subprocess.DEVNULL if self.new_session else None,
                start_new_session=self.new_session,
            )  # fmt: skip
        self.starts += 1
        return self.process

    def start(self, timeout: float = START_TIMEOUT_S, *, registered: bool = True) -> None:
        """Start tally; return once it is live and its webhook configuration points at it
        (``registered``), or only once its webhook serves (``registered=False``: a replica
        that is not the leader serves its webhook but registers nothing)."""
        self.spawn()
        deadline = time.monotonic() + timeout
        while not self.live():
            self._check_alive_before(deadline, "its liveness endpoint never answered")
            time.sleep(0.2)
        if not self._webhook_enabled:
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
            self._signal(signal.SIGINT)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                process.wait()
                raise OperatorError(
                    f"tally did not stop within {timeout} s of SIGINT:\n{self.log_text()}"
                ) from None
        return process.returncode

    def kill(self) -> None:
        """Stop whatever runs, without waiting politely (for cleanup after a failure)."""
        process = self.process
        if process is not None and process.poll() is None:
            self._signal(signal.SIGINT)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                process.wait()

    def _signal(self, signum: signal.Signals) -> None:
        """``signum`` to tally, or with ``new_session`` to its whole process group."""
        assert self.process is not None
        if not self.new_session:
            self.process.send_signal(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)
