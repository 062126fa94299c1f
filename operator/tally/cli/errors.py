"""The plugin's errors, and how an API error reads as one line.

Every failure the user can act on ends as one :class:`CliError` line on stderr and exit status
:data:`ERROR` (kubectl's convention for plugins: 0 success, 1 "no", anything else trouble).
An API error is told apart by what the user can do about it: a 403 from RBAC names the verb and
resource the user may not use (and where), a 401 points at the kubeconfig, a 404 is the
caller's to word (an unknown namespace, an unserved kind). Admission's 403s are not errors
here: ``why`` reads them as the answer it asked for (:func:`is_rbac_forbidden` tells them
apart).

Pure: a status code and a response body in, a sentence out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DOES_NOT_FIT",
    "ERROR",
    "OK",
    "CliError",
    "Target",
    "api_error_message",
    "is_rbac_forbidden",
    "status_message",
]

OK: Final = 0
DOES_NOT_FIT: Final = 1
"""``why``: the server refused the object."""
ERROR: Final = 2
"""Bad usage, an unreachable cluster, something the user may not read (argparse uses 2 too)."""

_RBAC_DENIAL: Final = re.compile(r'User "(?P<user>[^"]*)" cannot (?P<verb>\S+) resource')


class CliError(Exception):
    """A failure to report as one line (``error: <message>``) and exit status 2.

    ``forbidden``: RBAC refused the request; the command may go on with what it could read.
    """

    def __init__(self, message: str, *, forbidden: bool = False) -> None:
        super().__init__(message)
        self.forbidden = forbidden


@dataclass(frozen=True)
class Target:
    """What a request does, for messages: ``list clusterquotas.tally.dev at the cluster
    scope``, ``create pods in namespace "a"``."""

    verb: str
    resource: str
    """``<plural>`` for the core group, ``<plural>.<group>`` otherwise."""
    namespace: str | None = None
    name: str | None = None

    def __str__(self) -> str:
        what = f'{self.resource} "{self.name}"' if self.name else self.resource
        where = f'in namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        if self.resource == "namespaces":
            where = ""
        return " ".join(part for part in (self.verb, what, where) if part)


def status_message(body: object) -> str:
    """The ``message`` of a ``Status`` response body, or the body itself (trimmed)."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    try:
        parsed = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:300]
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        return str(parsed["message"])
    return " ".join(text.split())[:300]


def is_rbac_forbidden(status: int, message: str) -> bool:
    """Whether a 403 is the authorizer's (``User "x" cannot create resource "pods" …``), not
    an admission plugin's or webhook's refusal."""
    return status == 403 and _RBAC_DENIAL.search(message) is not None


def api_error_message(target: Target, status: int, reason: str, body: object) -> str:
    """One line for an API error answering ``target``'s request."""
    message = status_message(body)
    if status == 401:
        return (
            f"the API server did not accept your credentials to {target} (401 Unauthorized): "
            "check the user in your kubeconfig"
        )
    if status == 403 and is_rbac_forbidden(status, message):
        found = _RBAC_DENIAL.search(message)
        user = f'User "{found.group("user")}"' if found else "you"
        hint = ""
        if target.resource == "clusterquotas.tally.dev":
            hint = " (the ClusterRole tally-clusterquota-viewer grants it)"
        return f"forbidden: {user} may not {target}{hint}"
    if status == 404:
        return f"not found: {target}: {message}"
    return f"{target}: {status} {reason}: {message}"
