"""``kubectl tally``: the kubectl plugin, a top-level component beside :mod:`tally.app`.

Owns the ``kubectl-tally`` console script (:mod:`~tally.cli.main`: the commands ``status``,
``top`` and ``why``, and what each reads), its conversation with the API server as the user
(:mod:`~tally.cli.api`: the user's kubeconfig and rights, paged LISTs with progress, discovery,
the dry-run create; every failure one line, :mod:`~tally.cli.errors`), and the pure halves:
which quotas bind a namespace and how full they are (:mod:`~tally.cli.status`), who uses a
resource (:mod:`~tally.cli.top`), what an object would be charged and how to read a refusal
(:mod:`~tally.cli.why`), and how reports read (:mod:`~tally.cli.render`).

There is no server side: the figures are the quota controller's status and tally's own
evaluators (the registry tally's controller charges with, PodSet measures included), computed
on the user's machine from what the user may read. Never imports Kopf, and nothing in tally
imports it.
"""
