"""Kopf entry point: ``kopf run operator/main.py``.

Thin on purpose: importing :mod:`tally.app.handlers` registers every handler (and Kopf's
settings are applied by its start-up handler). ``operator/`` is a plain folder, never a package
(the standard library owns the module name ``operator``), so nothing may ``import main``.
"""

from tally.app import handlers  # noqa: F401  (importing registers the handlers)
