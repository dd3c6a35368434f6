from __future__ import annotations

import pytest

from cephcsi.errors import DeadlineExceeded, FailedPrecondition
from cephcsi.node.exec import CommandFailed, run

pytestmark = pytest.mark.unit


def test_success_and_output() -> None:
    result = run(["sh", "-c", "echo out; echo err >&2"], what="echo")
    assert (result.returncode, result.stdout, result.stderr) == (0, "out\n", "err\n")


def test_non_zero_exit_names_the_step() -> None:
    with pytest.raises(CommandFailed, match=r"probe thing failed: `sh -c 'echo boom >&2; exit 3'` exited 3: boom") as caught:
        run(["sh", "-c", "echo boom >&2; exit 3"], what="probe thing")
    assert caught.value.returncode == 3


def test_ok_codes() -> None:
    assert run(["sh", "-c", "exit 2"], what="x", ok_codes=(0, 2)).returncode == 2


def test_timeout() -> None:
    with pytest.raises(DeadlineExceeded, match="did not finish within 0.2s"):
        run(["sleep", "5"], what="sleep", timeout=0.2)


def test_missing_tool() -> None:
    with pytest.raises(FailedPrecondition, match="no-such-tool-xyz is not installed"):
        run(["no-such-tool-xyz"], what="x")


@pytest.mark.parametrize("arg", ["--key", "--key=AQB...", "--secret", "--secret=x"])
def test_inline_keys_are_refused(arg: str) -> None:
    with pytest.raises(ValueError, match="inline key"):
        run(["rbd", "map", arg], what="x")


def test_secrets_are_scrubbed_from_output_and_errors() -> None:
    secret = "AQBsecretsecret=="
    with pytest.raises(CommandFailed) as caught:
        run(["sh", "-c", "echo \"failed to decode key '$K'\" >&2; exit 1"], what="x", secrets=(secret,), env={"K": secret})
    assert secret not in caught.value.message
    assert "***" in caught.value.stderr


def test_locale_is_c() -> None:
    assert run(["sh", "-c", "echo $LC_ALL"], what="x").stdout.strip() == "C"
