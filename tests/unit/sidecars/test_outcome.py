"""Error classification, as external-provisioner's isFinalError + reschedule."""
from __future__ import annotations

import pytest

from cephcsi import errors
from cephcsi.sidecars.calls import Stopping
from cephcsi.sidecars.provisioner.outcome import Outcome, classify, describe

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("error", [errors.DeadlineExceeded("t"), errors.Unavailable("u"), errors.OperationInFlight("a"),
                                   Stopping("s"), errors.ResourceExhausted("r"), RuntimeError("api down")])
def test_maybe_still_running_means_in_progress(error: Exception) -> None:
    assert classify(error, may_reschedule=False) is Outcome.IN_PROGRESS


@pytest.mark.parametrize("error", [errors.InvalidArgument("i"), errors.NotFound("n"), errors.Internal("x"),
                                   errors.PermissionDenied("p"), errors.AlreadyExists("e"), errors.OutOfRange("o")])
def test_other_codes_are_final(error: Exception) -> None:
    assert classify(error, may_reschedule=True) is Outcome.FINAL


def test_resource_exhausted_with_a_selected_node_reschedules() -> None:
    assert classify(errors.ResourceExhausted("full"), may_reschedule=True) is Outcome.RESCHEDULE


def test_messages_read_like_external_provisioner() -> None:
    assert describe(errors.InvalidArgument("bad pool")) == "rpc error: code = InvalidArgument desc = bad pool"
    assert describe(errors.DeadlineExceeded("slow")).startswith("rpc error: code = DeadlineExceeded")
    assert describe(Stopping("x")).startswith("rpc error: code = Canceled")
    assert describe(RuntimeError("boom")) == "boom"
