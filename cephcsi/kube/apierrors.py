"""Classify errors from the kubernetes client, into predicates and into cephcsi.kube.errors.

The client raises `ApiException` for HTTP errors (status 0 for TLS failures) and lets urllib3
exceptions through for connection problems and timeouts; callers should not need to know which.
"""
from __future__ import annotations

import json
import socket

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


def classify(exc: BaseException, what: str) -> errors.ApiError:
    """The kube error for a failed API call; `what` names the call, e.g. "get PVC ns/name"."""
    code = status_code(exc)
    if is_timeout(exc):
        return errors.ApiTimeout(f"{what}: the API server did not answer in time; retry")
    if code == 404:
        return errors.ApiNotFound(f"{what}: not found")
    if code == 409:
        return errors.ApiConflict(f"{what}: conflict ({reason(exc) or 'stale object'}); retry")
    if code in (401, 403):
        return errors.ApiForbidden(f"{what}: refused by the API server ({code}); check the RBAC rules")
    if code in (400, 422):
        return errors.ApiRejected(f"{what}: rejected by the API server: {_message(exc)}")
    if is_transient(exc):
        return errors.ApiUnavailable(f"{what}: the API server is unavailable ({_short(exc)}); retry")
    return errors.ApiFailed(f"{what}: unexpected API error ({_short(exc)})")


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
