"""Errors shared across tally's controllers and admission."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class Conflict(Exception):
    """A write lost its compare-and-swap (HTTP 409): the object changed since it was read.

    Routine under concurrency; the caller retries from a fresher copy.
    """


class NotFound(Exception):
    """A write found no object (HTTP 404): it was deleted since it was read.

    Routine too: a quota deleted while requests were being judged against it. The caller
    goes on without it, as a fresh LIST would.
    """


class TooLarge(Exception):
    """A write the API server refused for its size: past its request body limit (413), or
    past what etcd accepts ("request is too large", or the gRPC message limit). Retrying the
    same object cannot help; a smaller one would."""


def encoded_size(obj: Mapping[str, Any] | None) -> int:
    """The size of ``obj`` as the API server receives and stores it (compact JSON, UTF-8): what
    :class:`TooLarge` is about."""
    return len(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode())
