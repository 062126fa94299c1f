"""Operator settings, read once at start-up from ``TALLY_*`` environment variables.

A pydantic model because this is a boundary: values arrive as strings from a Deployment or a
shell, and a typo or an absurd value must stop the operator with a message naming the variable,
not surface later as odd behaviour. Kopf's own settings (watching, peering) stay in the Kopf
wiring; these are tally's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ENV_PREFIX: Final = "TALLY_"


class SettingsError(ValueError):
    """An invalid setting; the message names the environment variable."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    resync_period: float = Field(default=300.0, gt=0, le=86400)
    """``TALLY_RESYNC_PERIOD``: seconds between full recalculations of every quota (upstream
    ``--resource-quota-sync-period``, 5 min)."""
    workers: int = Field(default=5, ge=1, le=100)
    """``TALLY_WORKERS``: workers per quota controller queue (upstream
    ``--concurrent-resource-quota-syncs``)."""
    metrics_addr: str = "0.0.0.0"
    """``TALLY_METRICS_ADDR``: where ``/metrics`` listens."""
    metrics_port: int = Field(default=8080, ge=0, le=65535)
    """``TALLY_METRICS_PORT``: ``/metrics`` port; 0 turns the endpoint off."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        environ = os.environ if environ is None else environ
        fields = {
            name: environ[ENV_PREFIX + name.upper()]
            for name in cls.model_fields
            if ENV_PREFIX + name.upper() in environ
        }
        try:
            return cls.model_validate(fields)
        except ValidationError as error:
            problems = "; ".join(
                f"{ENV_PREFIX}{str(e['loc'][0]).upper()}={fields.get(str(e['loc'][0]))!r}: "
                f"{e['msg']}"
                for e in error.errors()
            )
            raise SettingsError(f"invalid settings: {problems}") from None
