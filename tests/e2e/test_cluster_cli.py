"""hack/cluster.py refuses bad input with one clear line and leaves no process behind."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import cluster
from tally_e2e import ControlPlane

HACK = Path(cluster.__file__).resolve().parent


def _run(
    *args: str, env: dict[str, str] | None = None, script: Path | None = None
) -> tuple[int, list[str]]:
    result = subprocess.run(
        [sys.executable, str(script or HACK / "cluster.py"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    return result.returncode, [line for line in result.stderr.splitlines() if line.strip()]


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line mentions ``text`` (a test's private directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_unknown_mode(tmp_path: Path) -> None:
    code, lines = _run("up", "--mode", "bogus", "--dir", str(tmp_path / "plane"))
    assert code == 1
    assert lines == ["error: unknown mode 'bogus': expected one of operator, reference"]
    assert not (tmp_path / "plane" / "state.json").exists()


def test_up_on_a_directory_with_a_running_control_plane(control_plane: ControlPlane) -> None:
    directory = control_plane.kubeconfig.parent
    before = cluster.State.load(directory)
    assert before is not None, "the session's control plane was started by hack/cluster.py"
    code, lines = _run("up", "--mode", "operator", "--dir", str(directory))
    assert code == 1
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {directory} already holds a running control plane")
    # The running one is untouched: same processes, still serving.
    assert cluster.State.load(directory) == before
    assert cluster.running_components(before) == before.pids
    assert control_plane.kubectl("get", "ns", "default", "-o", "name").stdout.strip() == (
        "namespace/default"
    )


def test_port_clash(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = _run(
            "up", "--mode", "operator", "--dir", str(tmp_path), "--apiserver-port", str(port)
        )
    assert code == 1
    assert lines == [f"error: port {port} for kube-apiserver is already in use on 127.0.0.1"]
    assert _processes_mentioning(str(tmp_path)) == []


def test_failed_build(tmp_path: Path) -> None:
    # A copy of hack/ whose etcd main does not compile, building into a private cache.
    copy = tmp_path / "hack"
    copy.mkdir()
    shutil.copy(HACK / "cluster.py", copy / "cluster.py")
    shutil.copytree(HACK / "k8s", copy / "k8s")
    main_go = copy / "k8s" / "etcd" / "main.go"
    main_go.write_text(main_go.read_text() + "\nthis is not Go\n")
    cache = tmp_path / "cache"
    code, lines = _run("build", env={"TALLY_K8S_CACHE": str(cache)}, script=copy / "cluster.py")
    assert code == 1
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1
    assert errors[0].startswith("error: building etcd failed (go build exit 1); output in ")
    version_dir = Path(
        subprocess.run(
            [sys.executable, str(copy / "cluster.py"), "bin-dir"],
            capture_output=True,
            text=True,
            env={**os.environ, "TALLY_K8S_CACHE": str(cache)},
            check=True,
        ).stdout.strip()
    )
    # The failed build's own directory (keyed by the broken inputs) exists, and holds nothing
    # that looks built.
    assert version_dir.parent == cache
    assert version_dir.is_dir()
    assert not (version_dir / "etcd").exists()
    assert not (version_dir / ".inputs").exists()
    assert "etcd/main.go:15:1: syntax error" in Path(errors[0].rsplit(" ", 1)[1]).read_text()
    assert _processes_mentioning(str(tmp_path)) == []


def test_build_with_a_present_cache_builds_nothing() -> None:
    # The session's control plane already needed the binaries, so they are in the cache: a
    # second build (a second `make test`) must not run the Go toolchain at all.
    started = os.stat(cluster.bin_dir() / "kube-apiserver").st_mtime_ns
    result = subprocess.run(
        [sys.executable, str(HACK / "cluster.py"), "build"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": "/nonexistent"},  # no `go` to run, should it try
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(cluster.bin_dir())
    assert "building" not in result.stderr
    assert os.stat(cluster.bin_dir() / "kube-apiserver").st_mtime_ns == started
