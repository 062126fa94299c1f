"""Errors shared across tally's controllers and admission."""

from __future__ import annotations


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
