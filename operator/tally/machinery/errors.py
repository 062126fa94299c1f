"""Errors shared across tally's controllers and admission."""

from __future__ import annotations


class Conflict(Exception):
    """A write lost its compare-and-swap (HTTP 409): the object changed since it was read.

    Routine under concurrency; the caller retries from a fresher copy.
    """
