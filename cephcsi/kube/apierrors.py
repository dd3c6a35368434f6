"""Classify errors from the kubernetes client, into predicates and into cephcsi.kube.errors.

The client raises `ApiException` for HTTP errors (status 0 for TLS failures) and lets urllib3
exceptions through for connection problems and timeouts; callers should not need to know which.
"""
from __future__ import annotations

import json
import socket
from collections.abc import Callable

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from cephcsi.kube import errors


def status_code(exc: BaseException) -> int | None:
    """The HTTP status of an API error, None for errors that never got an HTTP answer."""
    if isinstance(exc, ApiException) and exc.status:
        return int(exc.status)
    return None


def reason(exc: BaseException) -> str:
    """The Status `reason` of an API error ("NotFound", "AlreadyExists", "Conflict", ...) or ""."""
    if not isinstance(exc, ApiException) or not exc.body:
        return ""
    try:
        body = json.loads(exc.body)
    except (TypeError, ValueError):
        return ""
    return str(body.get("reason", "")) if isinstance(body, dict) else ""


def is_not_found(exc: BaseException) -> bool:
    """404: the object (or its namespace) does not exist."""
    return status_code(exc) == 404


def is_conflict(exc: BaseException) -> bool:
    """409: a stale resourceVersion on update, or the name already exists on create."""
    return status_code(exc) == 409


def is_already_exists(exc: BaseException) -> bool:
    """409 with reason AlreadyExists (create of an existing name)."""
    return status_code(exc) == 409 and reason(exc) == "AlreadyExists"


def is_gone(exc: BaseException) -> bool:
    """410: the resourceVersion or continue token is too old; list again from scratch."""
    return status_code(exc) == 410


def is_timeout(exc: BaseException) -> bool:
    """The request ran out of time on our side or the server's (504 / 408)."""
    if isinstance(exc, (urllib3.exceptions.TimeoutError, socket.timeout, TimeoutError)):
        return True
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        return is_timeout(exc.reason)
    return status_code(exc) in (408, 504)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying as is: connection failures, timeouts, throttling (429) and 5xx."""
    if isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, socket.timeout, TimeoutError)):
        return True
    if isinstance(exc, ApiException) and not exc.status:
        return True  # TLS handshake and similar failures before any HTTP status
    code = status_code(exc)
    return code is not None and (code == 429 or code >= 500)


def _status_in(*codes: int) -> Callable[[BaseException], bool]:
    return lambda exc: status_code(exc) in codes


TABLE: tuple[tuple[Callable[[BaseException], bool], type[errors.ApiError], str], ...] = (
    (is_timeout, errors.ApiTimeout, "{what}: the API server did not answer in time; retry"),
    (_status_in(404), errors.ApiNotFound, "{what}: not found"),
    (_status_in(409), errors.ApiConflict, "{what}: conflict ({reason}); retry"),
    (_status_in(401, 403), errors.ApiForbidden, "{what}: refused by the API server ({code}); check the RBAC rules"),
    (_status_in(400, 422), errors.ApiRejected, "{what}: rejected by the API server: {message}"),
    (is_transient, errors.ApiUnavailable, "{what}: the API server is unavailable ({short}); retry"),
    (lambda _exc: True, errors.ApiFailed, "{what}: unexpected API error ({short})"),
)
"""Failed API calls (the client's ApiException, urllib3's errors), first match wins. The same
shape as the CSI side's tables (cephcsi.errors.Rule), kept apart because this layer knows
nothing of CSI; cephcsi.sidecars.kubeerrors maps these classes onward."""


def classify(exc: BaseException, what: str) -> errors.ApiError:
    """The kube error for a failed API call; `what` names the call, e.g. "get PVC ns/name"."""
    for matches, error, message in TABLE:
        if matches(exc):
            return error(message.format(what=what, reason=reason(exc) or "stale object", code=status_code(exc),
                                        message=_message(exc), short=_short(exc)))
    raise AssertionError("the table ends with a fallback row")


def _message(exc: BaseException) -> str:
    if isinstance(exc, ApiException) and exc.body:
        try:
            return str(json.loads(exc.body).get("message", exc.reason))
        except (TypeError, ValueError, AttributeError):
            pass
    return _short(exc)


def _short(exc: BaseException) -> str:
    code = status_code(exc)
    if code is not None:
        return f"HTTP {code}"
    return type(exc).__name__
