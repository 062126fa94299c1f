"""Serving tally's admission webhooks and keeping the API server pointed at them.

Owns :mod:`~tally.webhook.server` (AdmissionReview in, verdict out),
:mod:`~tally.webhook.connections` (accepting connections: TLS, timeouts, the cap),
:mod:`~tally.webhook.limits` (what the server may hold, and for how long),
:mod:`~tally.webhook.answers` (a retried review answered once),
:mod:`~tally.webhook.podset_scale` (a write of a PodSet's ``scale`` judged as the PodSet),
:mod:`~tally.webhook.configuration` (the ValidatingWebhookConfiguration: rules, paths, the
namespaceSelector), :mod:`~tally.webhook.registrar` (applies it and keeps it current),
:mod:`~tally.webhook.certs` (making and judging certificates; pure) and
:mod:`~tally.webhook.tls` (the serving certificate's life: Secret, mounted files or memory,
renewal, reload without closing the port). Sits above the controllers (it hands requests to
:mod:`tally.admission`) and below the wiring.
"""
