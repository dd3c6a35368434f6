"""The one decorator every CSI RPC goes through: request id, logging without secrets,
metrics, slow-call warnings and the mapping of cephcsi errors to gRPC status codes.

Servicers hold only storage logic: they raise `cephcsi.errors` exceptions and never touch the
gRPC context. The same methods are called in-process by the embedded sidecars with
`context=None`; then errors propagate as exceptions instead of gRPC statuses.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from cephcsi.errors import CephCSIError, Internal, status_of
from cephcsi.observability.logging import fields, request_id_var, request_scope
from cephcsi.observability.metrics import CSI_OPERATIONS, SLOW_CALLS
from cephcsi.observability.redact import redacted

log = logging.getLogger("cephcsi.rpc")

# Every CSI request is a protobuf message: its DEBUG rendering (redacted) walks the descriptor.
Request = TypeVar("Request", bound=Message)
Response = TypeVar("Response")

# Caller mistakes are logged at INFO, failures of ours or of our peers at WARNING/ERROR.
_CALLER_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNIMPLEMENTED,
}


# Polled constantly by the kubelet and probes: successes are logged at DEBUG only.
_CHATTY = {"Probe", "GetPluginInfo", "GetPluginCapabilities", "ControllerGetCapabilities",
           "NodeGetCapabilities", "NodeGetInfo", "NodeGetVolumeStats"}


class ServicerBase:
    """What the decorator needs from a servicer."""

    service_name: str = ""
    driver_name: str = ""
    slow_call_seconds: float = 10.0


def rpc(method: Callable[[Any, Request, Any], Response]) -> Callable[[Any, Request, Any], Response]:
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: ServicerBase, request: Request, context: grpc.ServicerContext | None) -> Response:
        full_name = f"/csi.v1.{self.service_name}/{name}"
        with request_scope(request_id_var.get() or None):
            started = time.monotonic()
            # Rendering the request (MessageToDict + the secret walk) costs more than the rest of
            # the wrapper together (py-spy, bench/README.md): only do it when DEBUG is on.
            if log.isEnabledFor(logging.DEBUG):
                log.debug("call", extra=fields(method=name, request=redacted(request)))
            code = grpc.StatusCode.OK
            try:
                response = method(self, request, context)
                return response
            except Exception as error:  # noqa: BLE001 - every failure must become a status
                code, message = status_of(error)
                _log_failure(name, error, code, message)
                if context is None:
                    if isinstance(error, CephCSIError):
                        raise
                    raise Internal(message) from error
                context.abort(code, message)
                raise AssertionError("unreachable: context.abort raises")  # pragma: no cover
            finally:
                elapsed = time.monotonic() - started
                CSI_OPERATIONS.labels(self.driver_name, full_name, code.name).observe(elapsed)
                if elapsed > self.slow_call_seconds:
                    SLOW_CALLS.labels(full_name).inc()
                    log.warning("slow call", extra=fields(method=name, seconds=round(elapsed, 3), code=code.name))
                elif code is grpc.StatusCode.OK:
                    level = logging.DEBUG if name in _CHATTY else logging.INFO
                    log.log(level, "ok", extra=fields(method=name, ms=round(elapsed * 1000, 1)))

    return wrapper


def _log_failure(name: str, error: BaseException, code: grpc.StatusCode, message: str) -> None:
    extra = fields(method=name, code=code.name, error=message)
    if not isinstance(error, CephCSIError):
        log.error("unexpected failure", exc_info=error, extra=extra)
    elif code in _CALLER_ERRORS:
        log.info("refused", extra=extra)
    else:
        log.warning("failed", extra=extra)
