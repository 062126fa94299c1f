#!/usr/bin/env python3
"""A real upstream Kubernetes control plane on loopback: build it, start it, stop it.

tally is never tested against a fake API server. This module builds kube-apiserver,
kube-controller-manager, kube-scheduler, kubectl and etcd from the upstream Go modules pinned
in ``hack/k8s/go.mod`` (the one place that names the Kubernetes version), caches the binaries
outside the repository (a fresh clone, which is what CI runs, finds them), and runs them as
plain processes on free loopback ports with certificates it generates itself.

Two modes:

* ``operator``: the ResourceQuota admission plugin and the resourcequota controller are off;
  tally is the quota system.
* ``reference``: upstream defaults, quota admission and controller on; the oracle that
  differential tests and benchmarks compare tally with.

Each control plane lives in one directory (``--dir``) holding its certificates, etcd data, logs,
``kubeconfig`` and ``state.json`` (pids, ports, mode, version). In operator mode kube-apiserver
also presents a client certificate to admission webhooks (``pki/webhook-client.crt``, signed by
``pki/webhook-client-ca.crt``, through an AdmissionConfiguration), so that tally's webhook can
require one (mutual TLS). In both modes the aggregation layer is configured as kubeadm
configures it: kube-apiserver proxies to extension API servers with ``pki/front-proxy-client.crt``
(signed by ``pki/front-proxy-ca.crt``) and publishes both in
``kube-system/extension-apiserver-authentication``. Several run side by side. ``down``
stops exactly the processes recorded there, and only after checking that each pid still runs
the binary it was started from (a recycled pid is left alone).

Simulated nodes (``up --nodes N``, default ``DEFAULT_NODES``): kube-scheduler, built from the
same pinned module, and kwok (``hack/kwok.py``: a simulated kubelet built from its own pinned
module) with N fake Nodes, on which pods are scheduled, become Running and Ready, complete
(restartPolicy Never, Jobs) and are deleted as a kubelet would do it (``hack/kwok/stages.yaml``).
Without nodes there is no scheduler and no kubelet, so pods stay Pending; tests set pod status
through the status subresource (``tests/e2e/tally_e2e.py``).

Used as a CLI (``python hack/cluster.py build|up|down|status``) and as a library by the e2e
fixtures. Standard library plus ``cryptography``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

HACK_DIR = Path(__file__).resolve().parent
GO_MODULE_DIR = HACK_DIR / "k8s"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
MODES = ("operator", "reference")
Mode = Literal["operator", "reference"]

# Start order; stop order is the reverse. The last two run only with simulated nodes.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

# Simulated nodes (``up --nodes N``): kwok-node-0 ... kwok-node-<N-1>, marked as kwok's by this
# annotation, which kwok selects on (a Node a test creates for itself is left alone). No taints:
# every pod may land on them. Their capacity is kwok's default (cpu 1k, memory 1Ti, pods 1M),
# so nothing is ever unschedulable for lack of room.
DEFAULT_NODES = 2
"""Simulated nodes of the planes the project starts (``up``'s CLI, ``make run``, the e2e suite,
the benchmarks): pods run as a cluster's do. The library's ``up`` starts none unless told."""
NODE_NAME_PREFIX = "kwok-node-"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Pod IPs kwok hands out: outside SERVICE_CLUSTER_IP_RANGE.
POD_CIDR = "10.244.0.0/16"

# A cold kube-apiserver takes a few seconds; under a parallel Go build or a loaded CI machine
# much longer. Generous, because a control plane that is slow to start is not broken.
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0

# In DIR/pki/: the CA that signs the client certificate kube-apiserver presents to webhooks
# (operator mode), that certificate and its key.
WEBHOOK_CLIENT_CA = "webhook-client-ca.crt"
WEBHOOK_CLIENT_CRT = "webhook-client.crt"
WEBHOOK_CLIENT_KEY = "webhook-client.key"
# The common name of the client certificate kube-apiserver proxies to extension API servers
# with (the aggregation layer; its CA is DIR/pki/front-proxy-ca.crt).
FRONT_PROXY_CLIENT_NAME = "front-proxy-client"

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"


class ClusterError(Exception):
    """A failure worth one clear line to the user (the CLI prints it and exits 1)."""


# --------------------------------------------------------------------------------------------
# Version and binaries


def kubernetes_version() -> str:
    """The pinned Kubernetes version, read from the ``require`` line of ``hack/k8s/go.mod``."""
    text = (GO_MODULE_DIR / "go.mod").read_text()
    match = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", text, re.MULTILINE)
    if not match:
        raise ClusterError(f"no k8s.io/kubernetes requirement in {GO_MODULE_DIR / 'go.mod'}")
    return match.group(1)


def cache_root() -> Path:
    """Where built binaries live: ``$TALLY_K8S_CACHE`` or ``~/.cache/tally/k8s``."""
    override = os.environ.get("TALLY_K8S_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "tally" / "k8s"


def bin_dir(version: str | None = None) -> Path:
    """``<cache>/<version>-<inputs digest>``: one immutable directory per build input.

    Keyed by the digest too, so that two checkouts whose hack/k8s differ (a branch that bumps a
    module, a CI clone beside a working tree) never overwrite each other's binaries or stamps.
    """
    return cache_root() / f"{version or kubernetes_version()}-{build_inputs_digest()[:12]}"


def build_inputs_digest(module_dir: Path = GO_MODULE_DIR) -> str:
    """A digest of everything a build reads from the repository's Go module ``module_dir``.

    Stored beside the binaries: a changed go.mod, go.sum or etcd main rebuilds even when the
    version string stays the same.
    """
    digest = hashlib.sha256()
    for path in sorted(module_dir.rglob("*")):
        if path.is_file() and path.suffix in {".go", ".mod", ".sum"}:
            digest.update(path.relative_to(module_dir).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def binaries_present(version: str | None = None) -> bool:
    directory = bin_dir(version)
    stamp = directory / ".inputs"
    return (
        all(os.access(directory / name, os.X_OK) for name in BINARIES)
        and stamp.exists()
        and stamp.read_text().strip() == build_inputs_digest()
    )


def _say(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


def go_toolchain() -> str:
    go = shutil.which("go")
    if go is None:
        raise ClusterError(
            "the Go toolchain (`go`) is not on PATH; it is needed to build the control plane"
        )
    return go


def _go_env() -> dict[str, str]:
    return {
        **os.environ,
        # Never let a `toolchain` line trigger a toolchain download.
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
        # go.mod and go.sum are committed and complete: a build never edits them.
        "GOFLAGS": "-mod=readonly",
    }


def _ldflags(version: str) -> str:
    minor = version.lstrip("v").split(".")[1]
    return " ".join(
        [
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={version}",
            "-X k8s.io/component-base/version.gitMajor=1",
            f"-X k8s.io/component-base/version.gitMinor={minor}",
            f"-X k8s.io/client-go/pkg/version.gitVersion={version}",
            "-X k8s.io/component-base/version.gitTreeState=clean",
        ]
    )


def go_build(
    directory: Path, name: str, go_command: Sequence[str], *, module_dir: Path = GO_MODULE_DIR
) -> None:
    """Run one ``go build``/``go test -c`` in the Go module ``module_dir``, writing
    ``directory/name`` atomically.

    ``go_command`` is the command up to, not including, ``-o``; the output goes to a temporary
    name renamed on success, so an interrupted build never leaves a binary that looks complete.
    """
    started = time.monotonic()
    _say(f"  go {go_command[1]} {name} ...")
    partial = directory / f".{name}.partial"
    log_path = directory / f"build-{name}.log"
    # nice: the machine is shared (tests, other builds); a build should yield to them.
    command = ["nice", "-n", "10", *go_command[:-1], "-o", str(partial), go_command[-1]]
    try:
        with open(log_path, "w") as log:
            result = subprocess.run(
                command, cwd=module_dir, env=_go_env(), stdout=log, stderr=subprocess.STDOUT
            )
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise ClusterError(
            f"building {name} failed (go {go_command[1]} exit {result.returncode}); "
            f"output in {log_path}"
        )
    partial.rename(directory / name)
    _say(f"  {name} built in {time.monotonic() - started:.0f} s")


def build(*, force: bool = False) -> Path:
    """Build the four binaries into the cache unless they are there already.

    Serialised by a lock file, so that two test sessions (or `make run` and `make test`) never
    build the same version at once. Each binary is written to a temporary name and renamed, so
    an interrupted build never leaves a binary that looks complete.
    """
    version = kubernetes_version()
    directory = bin_dir(version)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binaries_present(version) and not force:
            return directory
        go = go_toolchain()
        targets = {
            "etcd": "./etcd",
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        }
        stamp = directory / ".inputs"
        # Binaries stamped with the current inputs are kept: a binary added to BINARIES (or one
        # deleted by hand) is built alone.
        current = (
            not force and stamp.exists() and stamp.read_text().strip() == build_inputs_digest()
        )
        if current:
            targets = {
                name: package
                for name, package in targets.items()
                if not os.access(directory / name, os.X_OK)
            }
        else:
            stamp.unlink(missing_ok=True)
        _say(
            f"building Kubernetes {version} ({', '.join(targets)}) into {directory} "
            "(first build: ~10 min on 2 cores)"
        )
        for name, package in targets.items():
            # -p 2: two packages at a time keeps peak memory near 1 GB on this machine's size.
            go_build(
                directory,
                name,
                [go, "build", "-p", "2", "-tags", "providerless", "-trimpath",
                 "-ldflags", _ldflags(version), package],
            )  # fmt: skip
        stamp.write_text(build_inputs_digest() + "\n")
        return directory


# Upstream's end-to-end test binary (test/e2e) and the ginkgo CLI that runs it on several
# processes, for `make conformance` (hack/conformance.py). Cached beside the control-plane
# binaries, stamped with the same inputs digest in a file of their own, and built only on
# request: `make test` never needs them.
E2E_TEST = "e2e.test"
GINKGO = "ginkgo"
_E2E_TARGETS = {
    E2E_TEST: ("test", "k8s.io/kubernetes/test/e2e"),
    GINKGO: ("build", "github.com/onsi/ginkgo/v2/ginkgo"),
}


def e2e_test_present(version: str | None = None) -> bool:
    directory = bin_dir(version)
    stamp = directory / f".inputs-{E2E_TEST}"
    return (
        all(os.access(directory / name, os.X_OK) for name in _E2E_TARGETS)
        and stamp.exists()
        and stamp.read_text().strip() == build_inputs_digest()
    )


def build_e2e_test(*, force: bool = False) -> Path:
    """Build upstream's ``e2e.test`` and ``ginkgo`` at the pinned versions into the cache;
    return the directory holding them.

    ``go test -c k8s.io/kubernetes/test/e2e`` in the same module as the control plane (same
    replaces, same go.sum), ``-tags providerless``; ginkgo at the version k8s.io/kubernetes
    requires. Under the control plane's lock: one Go build at a time per version on this 2-core
    machine. After the control plane's build (whose packages it shares) ~2 minutes.
    """
    version = kubernetes_version()
    directory = bin_dir(version)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if e2e_test_present(version) and not force:
            return directory
        go = go_toolchain()
        stamp = directory / f".inputs-{E2E_TEST}"
        stamp.unlink(missing_ok=True)
        _say(f"building upstream's {E2E_TEST} {version} and {GINKGO} into {directory}")
        for name, (verb, package) in _E2E_TARGETS.items():
            test_flags = ["-c", "-vet=off"] if verb == "test" else []
            go_build(
                directory,
                name,
                [go, verb, *test_flags, "-p", "2", "-tags", "providerless", "-trimpath",
                 "-ldflags", _ldflags(version), package],
            )  # fmt: skip
        stamp.write_text(build_inputs_digest() + "\n")
        return directory


def ensure_binaries() -> Path:
    if binaries_present():
        return bin_dir()
    return build()


def cached_tool_main(
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    what: str,
    build: Callable[..., Path],
    path: Callable[[], Path],
    extra: dict[str, tuple[str, Callable[[], str]]] | None = None,
) -> int:
    """The CLI of a Go tool built into the cache beside the control plane (``hack/helm.py``,
    ``hack/floor.py``): ``build [--force]`` prints the binary's path once it is there, ``path``
    prints where it is (built or not), and each of ``extra`` (name: help, what to print)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help=f"build {what} into the cache (skipped if there)")
    build_cmd.add_argument("--force", action="store_true", help="rebuild even if cached")
    commands.add_parser("path", help="print the cached binary's path (it may not be built yet)")
    for name, (help_, _) in (extra or {}).items():
        commands.add_parser(name, help=help_)
    args = parser.parse_args(argv)

    def run() -> None:
        if args.command == "build":
            print(build(force=args.force))
        elif args.command == "path":
            print(path())
        else:
            print((extra or {})[args.command][1]())

    return run_cli(run)


def run_cli(command: Callable[[], None]) -> int:
    """A CLI's exit status: 0 once ``command`` ran, 1 on a :class:`ClusterError` (its message on
    stderr), 130 on an interrupt."""
    try:
        command()
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0


# --------------------------------------------------------------------------------------------
# Certificates


@dataclass(frozen=True)
class _Pki:
    ca_crt: Path
    ca_key: Path
    serving_crt: Path
    serving_key: Path
    admin_crt: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    webhook_client_ca: Path
    webhook_client_crt: Path
    webhook_client_key: Path
    front_proxy_ca: Path
    front_proxy_client_crt: Path
    front_proxy_client_key: Path


def _write_pki(directory: Path) -> _Pki:
    """A CA, a serving certificate for 127.0.0.1, an admin client certificate in
    ``system:masters``, the service-account signing key pair, and the API server's client
    certificates towards webhooks and towards extension API servers (the front proxy), each
    under a CA of its own."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before = now - datetime.timedelta(minutes=5)
    not_after = now + datetime.timedelta(days=365)

    def write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    def name(common_name: str, organization: str | None = None) -> x509.Name:
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        return x509.Name(attributes)

    def make_ca(
        ca_name: x509.Name,
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cert, key

    ca_name = name("tally-local-ca")
    ca_cert, ca_key = make_ca(ca_name)

    def leaf(
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: Sequence[x509.GeneralName] = (),
        *,
        issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] = (ca_cert, ca_key),
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        issuer_cert, issuer_key = issuer
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        return builder.sign(issuer_key, hashes.SHA256()), key

    serving, serving_key = leaf(
        name("kube-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        [
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address(KUBERNETES_SERVICE_IP)),
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
        ],
    )
    admin, admin_key = leaf(name("tally-admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    # The API server's identity towards webhooks (mutual TLS): a CA of its own that signs
    # nothing else, so a webhook trusting it admits the API server and no other client (the
    # cluster CA above also signs the admin's client certificate). Its key is not kept.
    webhook_ca, webhook_ca_key = make_ca(name("tally-local-webhook-client-ca"))
    webhook_client, webhook_client_key = leaf(
        name("kube-apiserver-webhook-client"),
        ExtendedKeyUsageOID.CLIENT_AUTH,
        issuer=(webhook_ca, webhook_ca_key),
    )
    # The aggregation layer's identity towards extension API servers, as kubeadm sets it up:
    # a CA of its own (an extension server trusts the user named in X-Remote-User only from
    # a client certificate it signs) and the client certificate the API server proxies with.
    front_proxy_ca, front_proxy_ca_key = make_ca(name("tally-local-front-proxy-ca"))
    front_proxy_client, front_proxy_client_key = leaf(
        name(FRONT_PROXY_CLIENT_NAME),
        ExtendedKeyUsageOID.CLIENT_AUTH,
        issuer=(front_proxy_ca, front_proxy_ca_key),
    )

    pki = _Pki(
        ca_crt=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_crt=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_crt=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        webhook_client_ca=directory / WEBHOOK_CLIENT_CA,
        webhook_client_crt=directory / WEBHOOK_CLIENT_CRT,
        webhook_client_key=directory / WEBHOOK_CLIENT_KEY,
        front_proxy_ca=directory / "front-proxy-ca.crt",
        front_proxy_client_crt=directory / "front-proxy-client.crt",
        front_proxy_client_key=directory / "front-proxy-client.key",
    )
    pem = serialization.Encoding.PEM
    pki.ca_crt.write_bytes(ca_cert.public_bytes(pem))
    write_key(pki.ca_key, ca_key)
    pki.serving_crt.write_bytes(serving.public_bytes(pem))
    write_key(pki.serving_key, serving_key)
    pki.admin_crt.write_bytes(admin.public_bytes(pem))
    write_key(pki.admin_key, admin_key)
    write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    pki.webhook_client_ca.write_bytes(webhook_ca.public_bytes(pem))
    pki.webhook_client_crt.write_bytes(webhook_client.public_bytes(pem))
    write_key(pki.webhook_client_key, webhook_client_key)
    pki.front_proxy_ca.write_bytes(front_proxy_ca.public_bytes(pem))
    pki.front_proxy_client_crt.write_bytes(front_proxy_client.public_bytes(pem))
    write_key(pki.front_proxy_client_key, front_proxy_client_key)
    return pki


def _write_admission_configuration(directory: Path, pki: _Pki) -> Path:
    """kube-apiserver's ``--admission-control-config-file``: the webhook admission plugins
    present ``pki.webhook_client_crt`` to every webhook they call.

    The kubeconfig it names is read by the API server's webhook authentication resolver: a
    ``users`` entry is picked by the webhook's host (``<svc>.<ns>.svc[:port]`` for a Service,
    the URL's host[:port] otherwise; ``*.`` prefixes match subdomains), and ``*`` is the
    fallback for every other webhook. Locally tally's webhook URL changes port at every start,
    so the wildcard is the entry that matters. A client certificate is presented only to a
    server that asks for one, so webhooks without mutual TLS see no difference.
    """
    kubeconfig = directory / "webhook-kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "users": [
                    {
                        "name": "*",
                        "user": {
                            "client-certificate": str(pki.webhook_client_crt),
                            "client-key": str(pki.webhook_client_key),
                        },
                    }
                ],
            },
            indent=2,
        )
        + "\n"
    )
    kubeconfig.chmod(0o600)
    plugin = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    path = directory / "admission-configuration.json"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {"name": name, "configuration": plugin}
                    for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
                ],
            },
            indent=2,
        )
        + "\n"
    )
    return path


@dataclass(frozen=True)
class WebhookClientPki:
    """What an operator-mode control plane's API server presents to webhooks (mutual TLS)."""

    ca: Path
    """The CA a webhook should trust for clients (``TALLY_WEBHOOK_CLIENT_CA``)."""
    cert: Path
    """The API server's client certificate (tests use it to talk to a webhook as the API
    server does)."""
    key: Path


def webhook_client_pki(directory: Path) -> WebhookClientPki | None:
    """The webhook client CA and certificate of the control plane in ``directory`` (the
    directory holding its ``kubeconfig``); None in reference mode, whose API server presents
    none. ClusterError for an operator-mode control plane without one (started before control
    planes had one) or a directory holding no control plane."""
    directory = directory.resolve()
    state = State.load(directory)
    if state is None:
        raise ClusterError(f"no control plane recorded in {directory} (no state.json)")
    if state.mode != "operator":
        return None
    pki = directory / "pki"
    found = WebhookClientPki(
        ca=pki / WEBHOOK_CLIENT_CA, cert=pki / WEBHOOK_CLIENT_CRT, key=pki / WEBHOOK_CLIENT_KEY
    )
    if not found.ca.exists():
        raise ClusterError(
            f"the operator-mode control plane in {directory} presents no client certificate to "
            "webhooks (started by an older hack/cluster.py); restart it (down, then up)"
        )
    return found


def _kubeconfig(server: str, pki: _Pki) -> str:
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    # JSON is valid YAML, and keeps this module free of a YAML dependency.
    return (
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "tally-local",
                        "cluster": {
                            "server": server,
                            "certificate-authority-data": b64(pki.ca_crt),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "tally-admin",
                        "user": {
                            "client-certificate-data": b64(pki.admin_crt),
                            "client-key-data": b64(pki.admin_key),
                        },
                    }
                ],
                "contexts": [
                    {
                        "name": "tally-local",
                        "context": {"cluster": "tally-local", "user": "tally-admin"},
                    }
                ],
                "current-context": "tally-local",
            },
            indent=2,
        )
        + "\n"
    )


# --------------------------------------------------------------------------------------------
# State


@dataclass
class State:
    """What ``state.json`` records about one running control plane."""

    mode: str
    version: str
    dir: str
    kubeconfig: str
    server: str
    bin_dir: str
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    started_at: str = ""
    nodes: int = 0
    """How many simulated nodes (kube-scheduler and kwok run when there are any)."""

    @classmethod
    def load(cls, directory: Path) -> State | None:
        path = directory / "state.json"
        if not path.exists():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as error:
            raise ClusterError(f"{path} is not a control-plane state file: {error}") from None

    def save(self) -> None:
        path = Path(self.dir) / "state.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(self), indent=2) + "\n")
        partial.rename(path)


def _pid_runs(pid: int, binary: str) -> bool:
    """Whether ``pid`` is alive and still the process started from ``binary``.

    Reads the executable link, not the command line: right after exec, ``/proc/PID/cmdline``
    can still be empty for a moment, which would make a starting component look dead.
    """
    try:
        executable = os.readlink(f"/proc/{pid}/exe")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # A zombie has exited; it only waits for its parent to reap it.
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    # A binary rebuilt while running shows as "<path> (deleted)".
    return os.path.basename(executable.removesuffix(" (deleted)")) == binary


def running_components(state: State) -> dict[str, int]:
    return {name: pid for name, pid in state.pids.items() if _pid_runs(pid, name)}


# --------------------------------------------------------------------------------------------
# Up


_handed_out: set[int] = set()


def free_port() -> int:
    """A port free on 127.0.0.1 now, and never one this process was given before: callers take
    several (liveness, metrics, webhook) before anything binds them, and the kernel may hand a
    port it just released out again, so two of them could get the same one."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _check_port_free(port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise ClusterError(f"port {port} for {what} is already in use on 127.0.0.1") from None


def _ssl_context(state: State) -> ssl.SSLContext:
    directory = Path(state.dir) / "pki"
    context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    context.load_cert_chain(str(directory / "admin.crt"), str(directory / "admin.key"))
    return context


def api_get(state: State, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET on the API server as the admin; (status, body), status 0 when unreachable."""
    return _api_request(state, urllib.request.Request(state.server + path), timeout)


def api_send(
    state: State, method: str, path: str, body: object, timeout: float = 5.0
) -> tuple[int, bytes]:
    """``method`` (POST, PUT...) of ``body`` as JSON on the API server as the admin; (status,
    body), status 0 when unreachable."""
    request = urllib.request.Request(
        state.server + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    return _api_request(state, request, timeout)


def _api_request(
    state: State, request: urllib.request.Request, timeout: float
) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(
            request, timeout=timeout, context=_ssl_context(state)
        ) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def _log_tail(directory: Path, component: str, lines: int = 8) -> str:
    path = directory / "logs" / f"{component}.log"
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _wait(state: State, what: str, check: Callable[[], bool], deadline: float) -> None:
    directory = Path(state.dir)
    while True:
        for component, pid in state.pids.items():
            if not _pid_runs(pid, component):
                last = _log_tail(directory, component, lines=1)
                raise ClusterError(
                    f"{component} exited while waiting for {what} "
                    f"(log: {directory / 'logs' / (component + '.log')}): {last}"
                )
        if check():
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out waiting for {what} (logs in {directory / 'logs'})")
        time.sleep(0.2)


def _spawn(
    state: State, component: str, argv: list[str], env: dict[str, str] | None = None
) -> None:
    directory = Path(state.dir)
    log = open(directory / "logs" / f"{component}.log", "ab")  # noqa: SIM115 - child keeps it
    with log:
        # A session of its own: Ctrl-C in the terminal that ran `up` reaches only the process
        # that owns the control plane, which then stops it in order (`down`).
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=directory,
            env=None if env is None else {**os.environ, **env},
        )
    state.pids[component] = process.pid
    state.save()


def restart_apiserver(state: State) -> float:
    """Stop this plane's kube-apiserver (SIGTERM; SIGKILL after ``STOP_TIMEOUT_S``) and start it
    again with the same command line, for tests and the soak that take the API server away
    under tally; returns the seconds it was not serving."""
    pid = state.pids["kube-apiserver"]
    argv = [arg.decode() for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if arg]
    stopped = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _pid_runs(pid, "kube-apiserver"):
        _reap(pid)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    _reap(pid)
    _spawn(state, "kube-apiserver", argv)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while api_get(state, "/readyz")[0] != 200:
        if time.monotonic() > deadline:
            raise ClusterError("kube-apiserver did not come back after a restart")
        time.sleep(0.2)
    return time.monotonic() - stopped


def up(
    directory: Path,
    mode: str,
    *,
    apiserver_port: int | None = None,
    extra_apiserver_args: Sequence[str] = (),
    extra_controller_manager_args: Sequence[str] = (),
    nodes: int = 0,
    kwok_pod_parallelism: int | None = None,
) -> State:
    """Start etcd, kube-apiserver and kube-controller-manager in ``mode``; wait until usable.

    With ``nodes`` > 0 also kube-scheduler and kwok, and that many simulated nodes; usable then
    also means every node Ready and untainted (pods are scheduled as soon as they are created).
    ``kwok_pod_parallelism``: how many pods kwok moves through a stage at once (kwok's
    ``podPlayStageParallelism``; None: kwok's default, 4). Each move is a request to the API
    server, so kwok's pace is at most this many per request latency: on a plane holding
    100 000 Pending pods kwok ran ~50 a second with 4. A kubelet starts its pods in parallel,
    one worker each.

    The extra arguments go last, so they override the defaults below (the last value of a flag
    wins): ``extra_controller_manager_args=["--kube-api-qps=20", "--kube-api-burst=30"]`` gives
    kube-controller-manager upstream's default client rate limit back.

    Usable means: ``/readyz`` answers ok, the ``default`` namespace exists and has its
    ``default`` service account (without it the ServiceAccount admission plugin rejects pods).
    Any failure stops whatever was started and raises ClusterError.
    """
    if mode not in MODES:
        raise ClusterError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
    if nodes < 0:
        raise ClusterError(f"--nodes must be 0 or more, not {nodes}")
    if kwok_pod_parallelism is not None and kwok_pod_parallelism < 1:
        raise ClusterError(f"kwok's pod parallelism must be 1 or more, not {kwok_pod_parallelism}")
    directory = directory.resolve()
    existing = State.load(directory)
    if existing is not None:
        alive = running_components(existing)
        if alive:
            listed = ", ".join(f"{name} pid {pid}" for name, pid in alive.items())
            raise ClusterError(
                f"{directory} already holds a running control plane ({listed}); "
                f"run `hack/cluster.py down --dir {directory}` first"
            )
    if apiserver_port is not None:
        _check_port_free(apiserver_port, "kube-apiserver")
    binaries = ensure_binaries()
    version = kubernetes_version()
    kwok_binary = _ensure_kwok() if nodes else None

    # A leftover from a control plane that died: its data and certificates are not reused.
    for stale in (
        "etcd", "pki", "logs", "state.json", "kubeconfig", "kwok", "kube-scheduler.json",
        "kwok-configuration.json",
    ):  # fmt: skip
        path = directory / stale
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    pki = _write_pki(directory / "pki")

    ports = {
        "etcd-client": free_port(),
        "etcd-peer": free_port(),
        "kube-apiserver": apiserver_port or free_port(),
        "kube-controller-manager": free_port(),
    }
    if nodes:
        ports["kube-scheduler"] = free_port()
    server = f"https://127.0.0.1:{ports['kube-apiserver']}"
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(_kubeconfig(server, pki))
    kubeconfig.chmod(0o600)
    state = State(
        mode=mode,
        version=version,
        dir=str(directory),
        kubeconfig=str(kubeconfig),
        server=server,
        bin_dir=str(binaries),
        ports=ports,
        started_at=datetime.datetime.now(datetime.UTC).isoformat(),
        nodes=nodes,
    )
    state.save()

    try:
        _start_components(state, pki, binaries, extra_apiserver_args, extra_controller_manager_args)
        if kwok_binary is not None:
            _start_nodes(state, binaries, kwok_binary, pod_parallelism=kwok_pod_parallelism)
    except BaseException:
        down(directory, quiet=True)
        raise
    return state


def _start_components(
    state: State,
    pki: _Pki,
    binaries: Path,
    extra_apiserver_args: Sequence[str],
    extra_controller_manager_args: Sequence[str] = (),
) -> None:
    directory = Path(state.dir)
    ports = state.ports
    deadline = time.monotonic() + READY_TIMEOUT_S
    etcd_url = f"http://127.0.0.1:{ports['etcd-client']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    _spawn(
        state,
        "etcd",
        [
            str(binaries / "etcd"),
            "--name=tally",
            f"--data-dir={directory / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=tally={peer_url}",
            # Throwaway data on loopback: durability buys nothing and fsync dominates latency.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
    )

    def etcd_healthy() -> bool:
        try:
            with urllib.request.urlopen(etcd_url + "/health", timeout=2) as response:
                return b'"true"' in response.read()
        except (urllib.error.URLError, OSError):
            return False

    _wait(state, "etcd /health", etcd_healthy, deadline)

    apiserver = [
        str(binaries / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports['kube-apiserver']}",
        # Otherwise it publishes 127.0.0.1 as the `kubernetes` Service endpoint, which
        # validation rejects.
        "--endpoint-reconciler-type=none",
        f"--client-ca-file={pki.ca_crt}",
        f"--tls-cert-file={pki.serving_crt}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--service-account-issuer=https://kubernetes.default.svc",
        "--authorization-mode=RBAC",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        "--profiling=false",
        # The aggregation layer, configured as kubeadm configures it (kube-apiserver publishes
        # these in kube-system/extension-apiserver-authentication for extension servers).
        f"--requestheader-client-ca-file={pki.front_proxy_ca}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT_NAME}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client_crt}",
        f"--proxy-client-key-file={pki.front_proxy_client_key}",
    ]
    if state.mode == "operator":
        apiserver.append("--disable-admission-plugins=ResourceQuota")
        # tally's webhook can require the API server's client certificate (mutual TLS).
        admission = _write_admission_configuration(directory / "pki", pki)
        apiserver.append(f"--admission-control-config-file={admission}")
    apiserver.extend(extra_apiserver_args)
    _spawn(state, "kube-apiserver", apiserver)
    _wait(state, "kube-apiserver /readyz", lambda: api_get(state, "/readyz")[0] == 200, deadline)

    controllers = "*,-resourcequota" if state.mode == "operator" else "*"
    _spawn(
        state,
        "kube-controller-manager",
        [
            str(binaries / "kube-controller-manager"),
            f"--kubeconfig={state.kubeconfig}",
            f"--authentication-kubeconfig={state.kubeconfig}",
            f"--authorization-kubeconfig={state.kubeconfig}",
            "--authentication-skip-lookup=true",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_crt}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-controller-manager']}",
            f"--controllers={controllers}",
            # The default 20 qps makes a ReplicaSet of 500 take ~24 s to fill; tests and the
            # reference side of benchmarks should measure the controllers, not the throttle.
            "--kube-api-qps=1000",
            "--kube-api-burst=1000",
            "--profiling=false",
            *extra_controller_manager_args,
        ],
    )
    _wait(
        state,
        "the default namespace",
        lambda: api_get(state, "/api/v1/namespaces/default")[0] == 200,
        deadline,
    )
    _wait(
        state,
        "the default service account",
        lambda: api_get(state, "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        deadline,
    )


def _ensure_kwok() -> Path:
    # hack/kwok.py imports this module; imported here, when needed, not at the top.
    import kwok

    return kwok.ensure_kwok()


def fake_node(name: str) -> dict[str, object]:
    """A simulated node as created: kwok fills in its status (Ready, addresses, capacity)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
    }


def _nodes_ready(state: State) -> bool:
    """Every simulated node Ready and free of the not-ready taint (which the API server puts on
    a new Node and kube-controller-manager removes once it is Ready)."""
    code, body = api_get(state, "/api/v1/nodes?labelSelector=type%3Dkwok")
    if code != 200:
        return False
    ready = [
        node
        for node in json.loads(body)["items"]
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in node.get("status", {}).get("conditions", [])
        )
        and not node["spec"].get("taints")
    ]
    return len(ready) == state.nodes


def _serving(port: int) -> bool:
    """Whether a component's /healthz on ``port`` answers ok (its certificate is self-signed:
    not verified; the path is open to anonymous requests)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/healthz", timeout=2, context=context
        ) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def kwok_configuration(pod_parallelism: int) -> dict[str, Any]:
    """kwok's KwokConfiguration with ``pod_parallelism`` pods moved through a stage at once.
    kwok does not default a configuration it reads from a file (an option left out is 0, and a
    parallelism of 0 stops kwok at start), so the rest of its defaults (v0.8.0) are spelt out;
    the flags ``_start_nodes`` passes override the ones they name."""
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "podPlayStageParallelism": pod_parallelism,
            "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
            "enableDebuggingHandlers": True,
            "enableContentionProfiling": False,
            "enableProfilingHandler": True,
        },
    }


def _start_nodes(
    state: State, binaries: Path, kwok_binary: Path, *, pod_parallelism: int | None = None
) -> None:
    """Start kube-scheduler and kwok, create ``state.nodes`` simulated nodes, and wait until
    the scheduler serves and every node is Ready."""
    import kwok

    directory = Path(state.dir)
    configs = [f"--config={kwok.STAGES}"]
    if pod_parallelism is not None:
        # kwok reads every --config given.
        options = directory / "kwok-configuration.json"
        options.write_text(json.dumps(kwok_configuration(pod_parallelism), indent=2) + "\n")
        configs.append(f"--config={options}")
    deadline = time.monotonic() + READY_TIMEOUT_S
    # Flags as kube-controller-manager's; the client settings in a configuration file, where
    # kube-scheduler's flags for them are deprecated. JSON is valid YAML.
    scheduler_config = directory / "kube-scheduler.json"
    scheduler_config.write_text(
        json.dumps(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {
                    "kubeconfig": state.kubeconfig,
                    # As kube-controller-manager's: measure the scheduler, not its throttle.
                    "qps": 1000,
                    "burst": 1000,
                },
                "leaderElection": {"leaderElect": False},
                "enableProfiling": False,
            },
            indent=2,
        )
        + "\n"
    )
    _spawn(
        state,
        "kube-scheduler",
        [
            str(binaries / "kube-scheduler"),
            f"--config={scheduler_config}",
            f"--authentication-kubeconfig={state.kubeconfig}",
            f"--authorization-kubeconfig={state.kubeconfig}",
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1",
            f"--secure-port={state.ports['kube-scheduler']}",
        ],
    )
    _spawn(
        state,
        "kwok",
        [
            str(kwok_binary),
            f"--kubeconfig={state.kubeconfig}",
            *configs,
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            f"--cidr={POD_CIDR}",
            "--node-lease-duration-seconds=40",
        ],
        # kwok reads ~/.kwok/kwok.yaml too if it exists; its work directory is this plane's.
        env={"KWOK_WORKDIR": str(directory / "kwok")},
    )
    for index in range(state.nodes):
        name = f"{NODE_NAME_PREFIX}{index}"
        code, body = api_send(state, "POST", "/api/v1/nodes", fake_node(name))
        if code != 201:
            raise ClusterError(f"creating node {name} failed ({code}): {body[:300]!r}")
    _wait(
        state,
        "kube-scheduler /healthz",
        lambda: _serving(state.ports["kube-scheduler"]),
        deadline,
    )
    _wait(state, f"{state.nodes} simulated node(s) Ready", lambda: _nodes_ready(state), deadline)


# --------------------------------------------------------------------------------------------
# Down and status


def down(directory: Path, *, clean: bool = False, quiet: bool = False) -> list[str]:
    """Stop the processes recorded in ``directory``; returns the names of those stopped.

    Only pids that still run the recorded binary are signalled. SIGTERM first (components shut
    down gracefully), SIGKILL after STOP_TIMEOUT_S.
    """
    directory = directory.resolve()
    state = State.load(directory)
    stopped: list[str] = []
    if state is not None:
        for component in reversed(COMPONENTS):
            pid = state.pids.get(component)
            if pid is None or not _pid_runs(pid, component):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while _pid_runs(pid, component) and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.05)
            if _pid_runs(pid, component):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                while _pid_runs(pid, component):
                    _reap(pid)
                    time.sleep(0.05)
            _reap(pid)
            stopped.append(component)
        (directory / "state.json").unlink(missing_ok=True)
    elif not quiet and not clean:
        raise ClusterError(f"no control plane recorded in {directory} (no state.json)")
    if clean and directory.exists():
        shutil.rmtree(directory)
    return stopped


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child (when `up` ran in this process)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def status(directory: Path) -> dict[str, object]:
    directory = directory.resolve()
    state = State.load(directory)
    if state is None:
        raise ClusterError(f"no control plane recorded in {directory} (no state.json)")
    alive = running_components(state)
    code, body = api_get(state, "/readyz") if "kube-apiserver" in alive else (0, b"")
    return {
        "dir": state.dir,
        "mode": state.mode,
        "version": state.version,
        "nodes": state.nodes,
        "kubeconfig": state.kubeconfig,
        "server": state.server,
        "components": {
            name: {"pid": pid, "running": name in alive} for name, pid in state.pids.items()
        },
        "readyz": body.decode(errors="replace").strip() if code == 200 else f"not ready ({code})",
        # Operator mode: the CA of the client certificate kube-apiserver presents to webhooks
        # (TALLY_WEBHOOK_CLIENT_CA for a tally run against this control plane).
        "webhook_client_ca": (
            str(directory / "pki" / WEBHOOK_CLIENT_CA) if state.mode == "operator" else None
        ),
    }


@contextlib.contextmanager
def running(
    directory: Path,
    mode: str,
    *,
    nodes: int = 0,
    kwok_pod_parallelism: int | None = None,
    extra_controller_manager_args: Sequence[str] = (),
) -> Iterator[State]:
    """``up`` for the duration of a ``with`` block, ``down`` after it, whatever happens."""
    state = up(
        directory,
        mode,
        nodes=nodes,
        kwok_pod_parallelism=kwok_pod_parallelism,
        extra_controller_manager_args=extra_controller_manager_args,
    )
    try:
        yield state
    finally:
        down(directory, quiet=True)


# --------------------------------------------------------------------------------------------
# CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/cluster.py", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="build the binaries into the cache")
    build_cmd.add_argument("--force", action="store_true", help="rebuild even if cached")
    build_cmd.add_argument(
        "--conformance",
        action="store_true",
        help=f"also build upstream's {E2E_TEST} and {GINKGO} (for `make conformance`)",
    )
    commands.add_parser("version", help="print the pinned Kubernetes version")
    commands.add_parser("bin-dir", help="print the directory holding the binaries")
    up_cmd = commands.add_parser("up", help="start a control plane")
    up_cmd.add_argument("--mode", required=True, help="operator | reference")
    up_cmd.add_argument("--dir", required=True, type=Path)
    up_cmd.add_argument(
        "--apiserver-port", type=int, default=None, help="kube-apiserver port (default: a free one)"
    )
    up_cmd.add_argument(
        "--nodes",
        type=int,
        default=DEFAULT_NODES,
        help="simulated nodes, with kube-scheduler and kwok "
        f"(default: {DEFAULT_NODES}; 0: none, pods stay Pending)",
    )
    down_cmd = commands.add_parser("down", help="stop a control plane")
    down_cmd.add_argument("--dir", required=True, type=Path)
    down_cmd.add_argument("--clean", action="store_true", help="also delete the directory")
    status_cmd = commands.add_parser("status", help="show a control plane's state")
    status_cmd.add_argument("--dir", required=True, type=Path)
    args = parser.parse_args(argv)
    return run_cli(lambda: _run_command(args))


def _run_command(args: argparse.Namespace) -> None:
    if args.command == "build":
        print(build(force=args.force))
        if args.conformance:
            print(build_e2e_test(force=args.force) / E2E_TEST)
    elif args.command == "version":
        print(kubernetes_version())
    elif args.command == "bin-dir":
        print(bin_dir())
    elif args.command == "up":
        state = up(args.dir, args.mode, apiserver_port=args.apiserver_port, nodes=args.nodes)
        nodes = f", {state.nodes} simulated node(s)" if state.nodes else ""
        _say(f"{state.mode} mode control plane ({state.version}{nodes}) ready at {state.server}")
        print(state.kubeconfig)
    elif args.command == "down":
        stopped = down(args.dir, clean=args.clean)
        _say("stopped " + (", ".join(stopped) if stopped else "nothing (none running)"))
    elif args.command == "status":
        print(json.dumps(status(args.dir), indent=2))


if __name__ == "__main__":
    # hack/kwok.py (imported by `up --nodes`) imports this module as `cluster`: the same module,
    # so that its ClusterError is the one main() catches.
    sys.modules.setdefault("cluster", sys.modules[__name__])
    sys.exit(main())
