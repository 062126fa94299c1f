"""tally.cli.main, errors and progress: the command line, one-line errors, exit statuses.

Nothing here reaches a cluster: the cases fail before any request (or never make one).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tally.cli.errors import ERROR, Target, api_error_message, is_rbac_forbidden
from tally.cli.main import build_parser, main, use_colour
from tally.cli.progress import Progress

pytestmark = pytest.mark.unit

RBAC_403 = json.dumps(
    {
        "kind": "Status",
        "status": "Failure",
        "reason": "Forbidden",
        "code": 403,
        "message": 'clusterquotas.tally.dev is forbidden: User "bob" cannot list resource '
        '"clusterquotas" in API group "tally.dev" at the cluster scope',
    }
)


@pytest.mark.parametrize(
    ("target", "status", "body", "message"),
    [
        pytest.param(
            Target("list", "clusterquotas.tally.dev"), 403, RBAC_403,
            'forbidden: User "bob" may not list clusterquotas.tally.dev at the cluster scope '
            "(the ClusterRole tally-clusterquota-viewer grants it)",
            id="rbac-names-verb-resource-scope",
        ),
        pytest.param(
            Target("list", "pods", "a"), 403,
            '{"message": "pods is forbidden: User \\"bob\\" cannot list resource \\"pods\\" in '
            'API group \\"\\" in the namespace \\"a\\""}',
            'forbidden: User "bob" may not list pods in namespace "a"',
            id="rbac-in-a-namespace",
        ),
        pytest.param(
            Target("get", "namespaces", name="a"), 401, "Unauthorized",
            'the API server did not accept your credentials to get namespaces "a" '
            "(401 Unauthorized): check the user in your kubeconfig",
            id="unauthorized",
        ),
        pytest.param(
            Target("create", "pods", "a"), 422, '{"message": "Pod \\"p\\" is invalid: x"}',
            'create pods in namespace "a": 422 Reason: Pod "p" is invalid: x',
            id="anything-else-keeps-the-servers-words",
        ),
    ],
)  # fmt: skip
def test_api_error_message(target: Target, status: int, body: str, message: str) -> None:
    assert message == api_error_message(target, status, "Reason", body)


def test_an_admission_refusal_is_not_an_rbac_refusal() -> None:
    webhook = 'admission webhook "quota.tally.dev" denied the request: exceeded quota: demo'
    assert not is_rbac_forbidden(403, webhook)
    assert is_rbac_forbidden(403, json.loads(RBAC_403)["message"])


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("choice", "tty", "environ", "colour"),
    [
        pytest.param("auto", True, {}, True, id="terminal"),
        pytest.param("auto", False, {}, False, id="piped"),
        pytest.param("auto", True, {"NO_COLOR": ""}, False, id="no-color"),
        pytest.param("auto", True, {"TERM": "dumb"}, False, id="dumb-terminal"),
        pytest.param("always", False, {}, True, id="always"),
        pytest.param("never", True, {}, False, id="never"),
    ],
)  # fmt: skip
def test_use_colour(choice: str, tty: bool, environ: dict[str, str], colour: bool) -> None:
    stream = Tty() if tty else io.StringIO()
    assert colour == use_colour(choice, stream, environ)


def test_progress_only_on_a_terminal_and_cleared() -> None:
    terminal = Tty()
    progress = Progress(terminal)
    progress.update("listing pods in a", 500)
    progress.update("listing pods in a", 1000)
    progress.clear()
    assert "\r\x1b[Klisting pods in a: 500\r\x1b[Klisting pods in a: 1000\r\x1b[K" == (
        terminal.getvalue()
    )
    piped = io.StringIO()
    progress = Progress(piped)
    progress.update("listing pods in a", 500)
    progress.clear()
    assert "" == piped.getvalue()


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--help"])
    assert 0 == exited.value.code
    out = capsys.readouterr().out
    assert "kubectl tally why -f pod.yaml -n team-a" in out
    assert "exit status: 0 done (why: it fits), 1 why: the server refuses it, 2 an error" in out


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param([], id="no-command"),
        pytest.param(["status", "-n", "a", "-A"], id="namespace-and-all"),
        pytest.param(["top", "--limit", "-1"], id="negative-limit"),
        pytest.param(["top", "-A"], id="top-is-per-namespace"),
        pytest.param(["why"], id="why-needs-a-file"),
        pytest.param(["status", "-o", "table"], id="unknown-output"),
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert ERROR == exited.value.code


def test_no_kubeconfig_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "nothing"
    assert ERROR == main(["status", "--kubeconfig", str(missing)])
    err = capsys.readouterr().err
    assert f"error: no kubeconfig at {missing}: pass --kubeconfig, or set KUBECONFIG" in err
    assert 1 == len(err.splitlines())


def test_an_unreadable_manifest_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ERROR == main(["why", "-f", str(tmp_path / "pod.yaml")])
    assert [f"error: cannot read {tmp_path / 'pod.yaml'}: No such file or directory"] == (
        capsys.readouterr().err.splitlines()
    )
