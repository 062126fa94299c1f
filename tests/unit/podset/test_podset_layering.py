"""The PodSet core stays pure: no Kopf, no Kubernetes client, no pydantic.

tally's layering rule (STYLE.md, "House rules"): the core imports none of ``kopf``,
``kubernetes_asyncio`` or ``pydantic``. This checks every module of ``tally.podset`` by reading
its imports, so it fails even for an import inside a function.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import tally.podset

pytestmark = pytest.mark.unit

FORBIDDEN = ("kopf", "kubernetes_asyncio", "pydantic")
PACKAGE = pathlib.Path(tally.podset.__file__).parent


def _imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in sorted(PACKAGE.glob("*.py"))])
def test_core_imports_nothing_forbidden(path: pathlib.Path) -> None:
    imported = _imported(ast.parse(path.read_text(), filename=str(path)))
    bad = {name for name in imported if name.split(".")[0] in FORBIDDEN}
    assert set() == bad, f"{path.name} imports {sorted(bad)}"
