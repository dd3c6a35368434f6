import errno

import grpc
import pytest
import rados
import rbd

from cephcsi import errors
from cephcsi.ceph.errors import ceph_call, translate
from cephcsi.errors import status_of

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFound, grpc.StatusCode.NOT_FOUND),
        (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
        (errors.OperationInFlight, grpc.StatusCode.ABORTED),
        (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
        (errors.OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
        (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
        (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
        (errors.Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
        (errors.Internal, grpc.StatusCode.INTERNAL),
    ],
)
def test_each_error_maps_to_its_code(cls: type[errors.CephCSIError], code: grpc.StatusCode) -> None:
    assert status_of(cls("why")) == (code, "why")


def test_unexpected_exception_is_internal_without_details() -> None:
    code, message = status_of(KeyError("userKey=AQsecret"))
    assert code is grpc.StatusCode.INTERNAL
    assert "AQsecret" not in message and "KeyError" in message


@pytest.mark.parametrize(
    ("error", "cls"),
    [
        (rados.TimedOut("t"), errors.DeadlineExceeded),
        (rados.ObjectNotFound("n"), errors.NotFound),
        (rbd.ImageNotFound("n"), errors.NotFound),
        (rbd.ImageExists("e"), errors.AlreadyExists),
        (rados.PermissionError("p"), errors.PermissionDenied),
        (rados.PermissionDeniedError("p"), errors.PermissionDenied),
        (rbd.ImageBusy("b", errno=errno.EBUSY), errors.FailedPrecondition),
        (rados.ConnectionShutdown("s"), errors.Unavailable),
        (rbd.NoSpace("s", errno=errno.ENOSPC), errors.ResourceExhausted),
        (rados.Error("odd"), errors.Internal),
    ],
)
def test_ceph_errors_are_translated(error: Exception, cls: type[errors.CephCSIError]) -> None:
    translated = translate(error, "create image", "image 'x'")
    assert type(translated) is cls
    assert "image 'x'" in translated.message


def test_ceph_call_translates_and_passes_own_errors_through() -> None:
    with pytest.raises(errors.DeadlineExceeded):
        with ceph_call("op", "thing"):
            raise rados.TimedOut("t")
    with pytest.raises(errors.InvalidArgument):
        with ceph_call("op", "thing"):
            raise errors.InvalidArgument("mine")
