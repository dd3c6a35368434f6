"""The Kubernetes machinery's own errors: what went wrong talking to the API server, in its
terms. The layers above translate them into theirs (cephcsi.sidecars.kubeerrors for the
gRPC-coded cephcsi.errors); this package knows nothing of CSI."""
from __future__ import annotations


class KubeError(Exception):
    """Base of the errors raised by cephcsi.kube; the message says what failed and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ClientConfigError(KubeError):
    """No usable client configuration (kubeconfig or in-cluster service account)."""


class ApiError(KubeError):
    """An API call failed; the subclass says how (apierrors.classify picks it)."""


class ApiTimeout(ApiError):
    """The API server did not answer in time (ours or its deadline: 408, 504)."""


class ApiNotFound(ApiError):
    """404: the object or its namespace does not exist."""


class ApiConflict(ApiError):
    """409: a stale resourceVersion, or the name exists already."""


class ApiForbidden(ApiError):
    """401/403: authentication or RBAC refused the call."""


class ApiRejected(ApiError):
    """400/422: the API server refused the request body."""


class ApiUnavailable(ApiError):
    """Connection failures, throttling (429) and 5xx: worth retrying."""


class ApiFailed(ApiError):
    """Any other failure."""
