"""TokenReviews and SubjectAccessReviews created on the API server, for who may read
``/metrics``: the two POSTs of :class:`tally.machinery.delegating_auth.Reviewer`.

Each is one POST of the review :mod:`tally.machinery.delegating_auth` wrote, whose answer (the
review with its ``status``) goes back as plain data; every failure (an error status, no
connection, an answer that is no JSON object) becomes a
:class:`~tally.machinery.delegating_auth.ReviewUnavailable` naming it, so that tally's log says
why metrics answered 503: most often a ClusterRole without ``create`` on ``tokenreviews`` or
``subjectaccessreviews``, which the API server's 403 names. Bounded by ``request_timeout`` as a
backstop; the caller's deadline is shorter.

Owns the paths and the error's words; what a review says, what an answer means, caching and
the deadline are :mod:`tally.machinery.delegating_auth`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from kubernetes_asyncio import client

from tally.kube import rest
from tally.machinery.delegating_auth import REVIEW_DEADLINE_S, ReviewUnavailable

TOKEN_REVIEWS: Final = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS: Final = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class KubeAccessReviewer:
    """Creates the reviews through ``api``: a client whose requests wait behind no one else's
    (``Runtime.dedicated_api``), so that a scrape is not judged late because the controllers
    are busy."""

    def __init__(
        self, api: client.ApiClient, *, request_timeout: float = REVIEW_DEADLINE_S
    ) -> None:
        self._api = api
        self._request_timeout = request_timeout

    async def create_token_review(self, review: Mapping[str, Any]) -> Mapping[str, Any]:
        return await self._create(TOKEN_REVIEWS, review)

    async def create_subject_access_review(self, review: Mapping[str, Any]) -> Mapping[str, Any]:
        return await self._create(SUBJECT_ACCESS_REVIEWS, review)

    async def _create(self, path: str, review: Mapping[str, Any]) -> Mapping[str, Any]:
        try:
            return await rest.request_json(
                self._api, "POST", path, review, request_timeout=self._request_timeout
            )
        except client.ApiException as error:
            raise ReviewUnavailable(
                f"POST {path}: {error.status} {error.reason}{_status_message(error.body)}"
            ) from None
        except TimeoutError:
            raise ReviewUnavailable(
                f"POST {path}: no answer within {self._request_timeout:g} s"
            ) from None
        except Exception as error:  # no connection, an answer that is not a JSON object
            raise ReviewUnavailable(f"POST {path}: {type(error).__name__}: {error}") from None


def _status_message(body: object) -> str:
    """``: <message>`` of the API server's Status in an error's body; "" when it has none."""
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else None
    except ValueError:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return f": {message}" if isinstance(message, str) and message else ""
