"""The node's Ceph tools never get a key they cannot read, and nothing they print carries a key."""
from __future__ import annotations

import base64
import os
import struct

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import FailedPrecondition
from cephcsi.node.exec import run, scrub
from cephcsi.node.mappers.tool_keys import ToolKeys
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

PACIFIC = "ceph version 16.2.15 (618f440892089921c3e944a991122ddc44e60516) pacific (stable)\n"
TENTACLE = "ceph version 20.2.4 (7f793731f1b39eb4f465e960113d2363c311b964) tentacle (stable - RelWithDebInfo)\n"


def key(cipher: int, length: int) -> str:
    return base64.b64encode(struct.pack("<HIIH", cipher, 1_790_000_000, 0, length) + os.urandom(length)).decode()


def tools(version: str, reads_aes256k: bool) -> FakeRunner:
    def respond(argv: list[str]) -> tuple[int, str, str] | None:
        if argv == ["rbd", "--version"]:
            return 0, version, ""
        if "--show-config-value" in argv:
            return (0, "false\n", "") if reads_aes256k else (1, "", "failed to get config option: option not found\n")
        return None
    return FakeRunner(respond)


def test_an_aes_key_needs_no_question() -> None:
    runner = tools(PACIFIC, False)
    ToolKeys(runner).check(Credentials("csi", key(1, 16)))
    assert runner.calls == []


def test_old_tools_are_refused_an_aes256k_key_before_they_see_it() -> None:
    runner = tools(PACIFIC, False)
    secret = key(2, 32)
    keys = ToolKeys(runner)
    with pytest.raises(FailedPrecondition) as caught:
        keys.check(Credentials("csi", secret))
    message = caught.value.message
    assert secret not in message
    assert "aes256k" in message and "16.2.15" in message and "rbd-fuse" in message
    assert "--key-type aes" in message
    with pytest.raises(FailedPrecondition):
        keys.check(Credentials("csi", secret))
    assert [c.argv[:2] for c in runner.calls] == [["rbd", "--version"], ["rbd", "-c"]], "asked once per mapper"
    assert all(secret not in " ".join(c.argv) for c in runner.calls)


def test_tools_that_read_aes256k_get_the_key() -> None:
    ToolKeys(tools(TENTACLE, True)).check(Credentials("csi", key(2, 32)))


def test_scrub_removes_every_form_of_a_given_key_and_any_other_key() -> None:
    given, other = key(2, 32), key(1, 16)
    secret = base64.b64decode(given)[12:]
    text = (f"auth: failed to decode key '{given}\n'\nsecret={base64.b64encode(secret).decode()} "
            f"hex {secret.hex()} keyring key = {other}\nimage csi-vol-{'a' * 40} pool rbd")
    cleaned = scrub(text, (given,))
    for leaked in (given, base64.b64encode(secret).decode(), secret.hex(), other):
        assert leaked not in cleaned
    assert f"csi-vol-{'a' * 40}" in cleaned and "pool rbd" in cleaned


def test_run_scrubs_what_a_tool_prints_before_it_is_logged_or_quoted(caplog: pytest.LogCaptureFixture) -> None:
    secret = key(2, 32)
    with caplog.at_level("DEBUG"):
        with pytest.raises(Exception) as caught:
            run(["sh", "-c", "echo \"auth: failed to decode key '$K'\" >&2; echo \"$K\"; exit 1"],
                what="x", secrets=(secret,), env={"K": secret})
    assert secret not in str(caught.value)
    logged = [str(vars(record)) for record in caplog.records if record.name == "cephcsi.node.exec"]
    assert logged and all(secret not in entry for entry in logged)
    assert any("failed to decode key '***" in entry for entry in logged)  # the stderr was logged, scrubbed


def test_an_rbd_fuse_refusal_of_an_aes_key_names_the_allowed_ciphers() -> None:
    """What rbd-fuse 16.2.15 printed for a right aes key on a Tentacle 20.2.4 cluster allowing only aes256k."""
    from cephcsi.ceph import cephx_keys
    from cephcsi.errors import PermissionDenied
    from cephcsi.node.exec import CommandFailed, Result
    from cephcsi.node.mappers import fuse

    stderr = ("2026-11-27T08:07:34.215+0000 7f77305c16c0 -1 monclient(hunting): handle_auth_bad_method server "
              "allowed_methods [2] but i only support [2,1]\nfailed to fetch mon config (--no-mon-config to skip)\n")
    failed = CommandFailed(Result(("rbd-fuse",), 1, "", stderr), "start rbd-fuse")
    found = fuse.translate(failed, "start rbd-fuse", cephx_keys.inspect(key(1, 16)))
    assert isinstance(found, PermissionDenied)
    assert "legacy aes cephx key" in found.message and "auth_allowed_ciphers aes256k,aes" in found.message
