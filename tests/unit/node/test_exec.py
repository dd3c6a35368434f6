from __future__ import annotations

import logging

import pytest

from cephcsi.errors import DeadlineExceeded, FailedPrecondition
from cephcsi.node.exec import REDACTED, CommandFailed, SecretArg, redact, run

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


# -- argv elements marked secret ------------------------------------------------------------------

WRAPPED = "c2VhbGVkLXBhc3NwaHJhc2UtdW5kZXItdGhlLWtlaw=="


def test_redact_hides_marked_elements_and_elements_holding_a_secret() -> None:
    argv = ["tool", "set", SecretArg(WRAPPED), f"--value={WRAPPED}", "plain"]
    assert redact(argv) == ("tool", "set", REDACTED, f"--value={WRAPPED}", "plain")
    assert redact(argv, (WRAPPED,)) == ("tool", "set", REDACTED, REDACTED, "plain")
    assert redact(["tool", "x"], ("",)) == ("tool", "x")  # an empty secret hides nothing
    assert repr(SecretArg(WRAPPED)) == REDACTED


def test_a_secret_argv_element_reaches_the_tool_but_no_log_line_or_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="cephcsi.node.exec")
    result = run(["sh", "-c", 'test "$1" = "$2" && echo same', "sh", SecretArg(WRAPPED), WRAPPED], what="x",
                 secrets=(WRAPPED,))
    assert result.stdout == "same\n"  # the tool got the real value
    assert WRAPPED not in " ".join(result.argv) and REDACTED in result.argv
    with pytest.raises(CommandFailed) as failed:
        run(["sh", "-c", "exit 4", "sh", SecretArg(WRAPPED)], what="fail")
    assert WRAPPED not in failed.value.message and REDACTED in failed.value.message
    assert WRAPPED not in " ".join(failed.value.result.argv)
    with pytest.raises(CommandFailed) as echoed:  # sleep quotes its invalid argument in stderr
        run(["sleep", SecretArg(WRAPPED)], what="echo")
    assert WRAPPED not in echoed.value.message and WRAPPED not in echoed.value.stderr
    with pytest.raises(DeadlineExceeded) as late:
        run(["sh", "-c", "sleep 5", "sh", SecretArg(WRAPPED)], what="late", timeout=0.2)
    assert WRAPPED not in late.value.message and REDACTED in late.value.message
    logged = [(record.getMessage(), vars(record)) for record in caplog.records]
    assert len(logged) >= 2  # the debug lines and the timeout warning were captured
    assert not [entry for entry in logged if WRAPPED in repr(entry)]


def test_an_unmarked_argv_element_is_logged_as_is(caplog: pytest.LogCaptureFixture) -> None:
    """The control: the capture above would see a value that is not marked."""
    caplog.set_level(logging.DEBUG, logger="cephcsi.node.exec")
    run(["true", WRAPPED], what="x")
    assert any(WRAPPED in repr(vars(record)) for record in caplog.records)
