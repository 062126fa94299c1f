"""Kopf entry point: ``kopf run operator/main.py``.

Thin on purpose: importing ``tally.handlers`` registers every handler; this file only applies
the operator-wide Kopf settings. ``operator/`` is a plain folder, never a package (the standard
library owns the module name ``operator``), so nothing may ``import main``.
"""

from tally import handlers  # noqa: F401  (importing registers the handlers)
