#!/usr/bin/env python3
"""``make run``: a control plane (unless KUBECONFIG names a cluster), CRDs, examples, operator.

Starts an operator-mode control plane in ``.cluster/run`` (reused if one from an earlier run
is still up), installs ``crds/*.yaml``, applies ``crds/examples/*.yaml``, prints how to point
kubectl at it, and runs ``kopf run operator/main.py`` in the foreground. Ctrl-C stops the
operator, then the control plane this script started; one it found running is left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import cluster

REPO = Path(__file__).resolve().parent.parent
RUN_DIR = REPO / ".cluster" / "run"


def _kubectl(kubectl: Path, kubeconfig: str, *args: str) -> None:
    subprocess.run([str(kubectl), f"--kubeconfig={kubeconfig}", *args], check=True)


def main() -> int:
    started_here = False
    kubeconfig = os.environ.get("KUBECONFIG", "")
    mutual_tls: dict[str, str] = {}
    try:
        kubectl = cluster.ensure_binaries() / "kubectl"
        if kubeconfig:
            print(f"[run] using the cluster KUBECONFIG names: {kubeconfig}", flush=True)
        else:
            state = cluster.State.load(RUN_DIR)
            if state is not None and cluster.running_components(state) == state.pids:
                print(f"[run] reusing the control plane already running in {RUN_DIR}", flush=True)
            else:
                state = cluster.up(RUN_DIR, "operator", nodes=cluster.DEFAULT_NODES)
                started_here = True
            kubeconfig = state.kubeconfig
            # The webhook requires the API server's client certificate, as in a cluster set up
            # for it (README, "Mutual TLS"); a control plane from before that has none.
            try:
                pki = cluster.webhook_client_pki(RUN_DIR)
            except cluster.ClusterError as error:
                print(f"[run] no mutual TLS: {error}", flush=True)
            else:
                if pki is not None:
                    mutual_tls = {"TALLY_WEBHOOK_CLIENT_CA": str(pki.ca)}
    except cluster.ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    try:
        crds = sorted((REPO / "crds").glob("*.yaml"))
        if crds:
            for crd in crds:
                _kubectl(kubectl, kubeconfig, "apply", "-f", str(crd))
            _kubectl(kubectl, kubeconfig, "wait", "--for=condition=Established", "crd", "--all")
        for example in sorted((REPO / "crds" / "examples").glob("*.yaml")):
            _kubectl(kubectl, kubeconfig, "apply", "-f", str(example))

        liveness_port = cluster.free_port()
        metrics_port = cluster.free_port()
        readiness_port = cluster.free_port()
        print(
            "\n[run] tally is starting. From another shell:\n"
            f"    export KUBECONFIG={kubeconfig}\n"
            f"    alias kubectl={kubectl}\n"
            "    kubectl get ns\n"
            f"  liveness: http://127.0.0.1:{liveness_port}/healthz\n"
            f"  metrics:  http://127.0.0.1:{metrics_port}/metrics\n"
            f"  ready:    http://127.0.0.1:{readiness_port}/readyz\n"
            "  Ctrl-C here stops the operator"
            + (" and the control plane.\n" if started_here else ".\n"),
            flush=True,
        )
        operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kopf",
                "run",
                str(REPO / "operator" / "main.py"),
                "--all-namespaces",
                "--standalone",
                f"--liveness=http://127.0.0.1:{liveness_port}/healthz",
            ],
            cwd=REPO,
            env={
                **os.environ,
                "KUBECONFIG": kubeconfig,
                "TALLY_METRICS_ADDR": "127.0.0.1",
                "TALLY_METRICS_PORT": str(metrics_port),
                "TALLY_READINESS_ADDR": "127.0.0.1",
                "TALLY_READINESS_PORT": str(readiness_port),
                "TALLY_WEBHOOK_PORT": str(cluster.free_port()),
                **mutual_tls,
            },
        )
        try:
            return operator.wait()
        except KeyboardInterrupt:
            # The terminal sent SIGINT to the operator too; let it finish its cleanup.
            operator.send_signal(signal.SIGINT)
            try:
                operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
            return 0
    except subprocess.CalledProcessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        if started_here:
            stopped = cluster.down(RUN_DIR, quiet=True)
            print(f"[run] stopped {', '.join(stopped) or 'nothing'}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
