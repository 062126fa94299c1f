"""The one exception quota admission answers a request with, and the HTTP statuses it carries.

Upstream's admission plugin returns Go errors that the API server turns into a ``metav1.Status``:

* ``admission.NewForbidden(a, err)`` → 403, reason ``Forbidden``, and the client sees
  ``<resource> "<name>" is forbidden: <err>``. A validating webhook cannot reproduce that prefix
  (the API server writes ``admission webhook "<id>" denied the request: <message>``), so
  :attr:`AdmissionDenied.message` is only the part after ``forbidden: ``;
* ``apierrors.NewInternalError(err)`` → 500, reason ``InternalError``, message
  ``Internal error occurred: <err>`` (the evaluation timeout);
* a plain ``fmt.Errorf`` → 500, reason ``Unknown``, message ``<err>`` exactly (``insufficient
  quota to match these scopes``, evaluator failures);
* the API error of a failed status write, passed through → e.g. 409 ``Conflict``.

The message texts live next to the code that raises them (``checks.py``, ``evaluator.py``);
this module only holds the exception and the constructors for each kind of status, so every
raise site says which kind it is.

Left out: the AdmissionReview response itself; the webhook adapter turns an
:class:`AdmissionDenied` into ``allowed: false`` with ``status.code`` and ``status.message``.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CONFLICT",
    "FORBIDDEN",
    "INTERNAL_ERROR",
    "AdmissionDenied",
    "forbidden",
    "internal_error",
    "unknown_error",
]

FORBIDDEN: Final = 403
"""``admission.NewForbidden``: the request breaks a quota rule."""
CONFLICT: Final = 409
"""The quota status write lost every compare-and-swap attempt (``apierrors.NewConflict``)."""
INTERNAL_ERROR: Final = 500
"""``apierrors.NewInternalError`` and plain Go errors: tally could not decide."""

REASON_FORBIDDEN: Final = "Forbidden"
REASON_CONFLICT: Final = "Conflict"
REASON_INTERNAL_ERROR: Final = "InternalError"
REASON_UNKNOWN: Final = ""
"""A plain Go error becomes a Status with reason ``Unknown``, which is the empty string."""

INTERNAL_ERROR_PREFIX: Final = "Internal error occurred: "
"""What ``apierrors.NewInternalError`` puts before the error text."""


class AdmissionDenied(Exception):
    """The request is refused: answer it with :attr:`code` and :attr:`message`.

    ``message`` is upstream's text as the client sees it after the webhook prefix (no
    ``pods "x" is forbidden: `` part); ``code`` is the HTTP status upstream returns; ``reason``
    is the ``metav1.StatusReason`` for adapters that can set it (``""`` is ``Unknown``).
    """

    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason if reason is not None else _default_reason(code)

    def __repr__(self) -> str:
        return f"AdmissionDenied({self.code}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AdmissionDenied):
            return NotImplemented
        return (self.code, self.message, self.reason) == (other.code, other.message, other.reason)

    def __hash__(self) -> int:
        return hash((self.code, self.message, self.reason))


def forbidden(message: str) -> AdmissionDenied:
    """403 ``Forbidden``: upstream ``admission.NewForbidden(a, errors.New(message))``."""
    return AdmissionDenied(FORBIDDEN, message, REASON_FORBIDDEN)


def internal_error(text: str) -> AdmissionDenied:
    """500 ``InternalError``: upstream ``apierrors.NewInternalError(errors.New(text))``."""
    return AdmissionDenied(INTERNAL_ERROR, INTERNAL_ERROR_PREFIX + text, REASON_INTERNAL_ERROR)


def unknown_error(message: str) -> AdmissionDenied:
    """500 with reason ``Unknown``: a plain Go error returned from admission, text unchanged."""
    return AdmissionDenied(INTERNAL_ERROR, message, REASON_UNKNOWN)


def _default_reason(code: int) -> str:
    if code == FORBIDDEN:
        return REASON_FORBIDDEN
    if code == CONFLICT:
        return REASON_CONFLICT
    return REASON_UNKNOWN
