"""Kubernetes API failures as cephcsi errors, at the sidecars' boundary.

cephcsi.kube classifies a failed call into its own errors (cephcsi.kube.apierrors.classify);
this table says what each means to the CSI side, so a work item fails with the gRPC-coded
error its retry and event logic expect. The message is kept as classified (it names the call).
"""
from __future__ import annotations

from cephcsi import errors
from cephcsi.kube import apierrors
from cephcsi.kube import errors as kube_errors

TABLE: dict[type[kube_errors.KubeError], type[errors.CephCSIError]] = {
    kube_errors.ApiTimeout: errors.DeadlineExceeded,
    kube_errors.ApiNotFound: errors.NotFound,
    kube_errors.ApiConflict: errors.OperationInFlight,
    kube_errors.ApiForbidden: errors.PermissionDenied,
    kube_errors.ApiRejected: errors.InvalidArgument,
    kube_errors.ApiUnavailable: errors.Unavailable,
    kube_errors.ApiFailed: errors.Internal,
    kube_errors.ClientConfigError: errors.ConfigError,
}


def from_kube(error: kube_errors.KubeError) -> errors.CephCSIError:
    """The cephcsi error for one of cephcsi.kube's (Internal for a kind the table lacks)."""
    return TABLE.get(type(error), errors.Internal)(error.message)


def translate(exc: BaseException, what: str) -> errors.CephCSIError:
    """The cephcsi error for a failed API call; `what` names the call, e.g. "get PVC ns/name"."""
    return from_kube(exc if isinstance(exc, kube_errors.KubeError) else apierrors.classify(exc, what))


EXPLAINED: tuple[type[BaseException], ...] = (errors.CephCSIError, kube_errors.KubeError)
"""Work-item failures whose message explains them: the work queues log these without a traceback."""
