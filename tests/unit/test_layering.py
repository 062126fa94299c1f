"""The import contracts `make lint` checks (``[tool.importlinter]`` in pyproject.toml) hold, and
fail when a module breaks them.

Each case copies the package to a temporary folder, adds one forbidden import to one module,
and runs ``lint-imports`` with the project's contracts against the copy: the contract the import
breaks must be reported broken, by name. The unchanged copy must keep every contract.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(tmp_path: Path, module: str, line: str) -> str:
    source = tmp_path / "src"
    shutil.copytree(REPO / "operator" / "tally", source / "tally")
    if module:
        path = source / (module.replace(".", "/") + ".py")
        path.write_text(path.read_text() + f"\n{line}\n")
    result = subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(source)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout + result.stderr


def test_the_package_keeps_every_contract(tmp_path: Path) -> None:
    output = _lint(tmp_path, "", "")
    assert "Contracts: 4 kept, 0 broken." in output, output


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        pytest.param(
            "tally.quota.quantity", "import kopf",
            "The pure core imports no API client, no HTTP server, no pydantic BROKEN",
            id="pure-core-imports-kopf",
        ),
        pytest.param(
            "tally.machinery.cache", "import kubernetes_asyncio",
            "The pure core imports no API client, no HTTP server, no pydantic BROKEN",
            id="pure-core-imports-the-api-client",
        ),
        pytest.param(
            "tally.kube.reflector", "import kopf",
            "Only the wiring (tally.app) imports Kopf BROKEN",
            id="an-adapter-imports-kopf",
        ),
        pytest.param(
            "tally.machinery.cache", "import tally.app.runtime",
            "Layers: Kopf wiring on top, the pure core at the bottom, imports only go down "
            "BROKEN",
            id="lower-layer-imports-higher",
        ),
        pytest.param(
            "tally.admission.checks", "import tally.resourcequota.controller",
            "Layers: Kopf wiring on top, the pure core at the bottom, imports only go down "
            "BROKEN",
            id="sibling-controllers-import-each-other",
        ),
        pytest.param(
            "tally.workqueue.clock", "import tally.machinery.correlator",
            "Layers: Kopf wiring on top, the pure core at the bottom, imports only go down "
            "BROKEN",
            id="the-bottom-imports-machinery",
        ),
        pytest.param(
            "tally.evaluators.base", "import tally.podset.podutil",
            "The quota side never imports PodSet BROKEN",
            id="quota-side-imports-podset",
        ),
        pytest.param(
            "tally.cli.main", "import kopf",
            "Only the wiring (tally.app) imports Kopf BROKEN",
            id="the-kubectl-plugin-imports-kopf",
        ),
        pytest.param(
            "tally.app.runtime", "import tally.cli.main",
            "Layers: Kopf wiring on top, the pure core at the bottom, imports only go down "
            "BROKEN",
            id="the-operator-imports-the-kubectl-plugin",
        ),
        pytest.param(
            "tally.webhook.server", "import tally.cli.render",
            "Layers: Kopf wiring on top, the pure core at the bottom, imports only go down "
            "BROKEN",
            id="a-lower-layer-imports-the-kubectl-plugin",
        ),
    ],
)  # fmt: skip
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    output = _lint(tmp_path, module, line)
    assert broken in output, output
