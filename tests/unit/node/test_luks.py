"""cephcsi.node.luks with a fake cryptsetup/blkid: the argv ceph-csi's volumes need (LUKS2,
sha256, 32 MiB argon2 memory, --disable-keyring), the never-reformat rule, idempotent open and
close, and that the passphrase goes to stdin only — plus one real child process proving that
stdin reaches it and its echo is scrubbed."""
from __future__ import annotations

import os

import pytest

from cephcsi.errors import FailedPrecondition, PermissionDenied
from cephcsi.node import exec as node_exec, luks
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

VOLUME = "0001-0009-rook-ceph-0000000000000002-8bd3b7f0-54d7-11ee-9a8c-0242ac110004"
PASSPHRASE = "k6d1Xq3pS0wJZ8ZbYyLhBv7mC3A="
ACTIVE = """/dev/mapper/luks-rbd-x is active and is in use.
  type:    LUKS2
  cipher:  aes-xts-plain64
  keysize: 512 bits
  key location: dm-crypt
  device:  /dev/rbd0
  sector size:  512
  offset:  32768 sectors
  size:    98304 sectors
  mode:    read/write
"""


@pytest.fixture
def device(tmp_path: os.PathLike[str]) -> str:
    path = os.path.join(tmp_path, "rbd0")
    with open(path, "wb") as handle:
        handle.truncate(1 << 20)
    return path


def cryptsetup(blkid: str = "", active: str = "", is_luks: bool = False, open_rc: int = 0) -> FakeRunner:
    def respond(argv: list[str]) -> tuple[int, str, str] | None:
        if argv[0] == "blkid":
            return (0, blkid, "") if blkid else (2, "", "")
        if argv[1:2] == ["status"]:
            return (0, active, "") if active else (4, f"/dev/mapper/{argv[2]} is inactive.\n", "")
        if argv[1:2] == ["isLuks"]:
            return (0 if is_luks else 1, "", "")
        if argv[1:2] == ["luksOpen"] and open_rc:
            return (open_rc, "", "No key available with this passphrase.")
        return None
    return FakeRunner(respond)


def test_the_mapping_is_named_as_ceph_csi_names_it() -> None:
    assert luks.dm_name(VOLUME) == f"luks-rbd-{VOLUME}"
    assert luks.mapper_path(luks.dm_name(VOLUME)) == f"/dev/mapper/luks-rbd-{VOLUME}"


def test_status_parses_an_active_mapping_and_none_for_an_inactive_one() -> None:
    status = luks.parse_status("luks-rbd-x", ACTIVE)
    assert status == luks.Status("luks-rbd-x", "/dev/rbd0", "LUKS2", 98304, 32768, True)
    assert status.path == "/dev/mapper/luks-rbd-x"
    assert luks.parse_status("luks-rbd-x", "/dev/mapper/luks-rbd-x is inactive.\n") is None
    assert luks.parse_status("luks-rbd-x", "") is None


def test_a_blank_device_is_formatted_luks2_with_the_passphrase_on_stdin(device: str) -> None:
    runner = cryptsetup()
    assert luks.Luks(runner, 30).format(device, PASSPHRASE, VOLUME) is True
    call = runner.calls[-1]
    assert call.argv == ["cryptsetup", "-q", "luksFormat", "--type", "luks2", "--hash", "sha256",
                         "--pbkdf-memory", "32768", "--key-file=-", device]
    assert call.stdin == PASSPHRASE
    assert PASSPHRASE in call.secrets
    assert not any(PASSPHRASE in arg for c in runner.calls for arg in c.argv)
    assert not any(flag in call.argv for flag in ("--force-password", "--batch-mode-force"))


def test_a_luks_header_is_kept_and_never_formatted_again(device: str) -> None:
    runner = cryptsetup(blkid="TYPE=crypto_LUKS\nUSAGE=crypto\nVERSION=2\n")
    assert luks.Luks(runner, 30).format(device, PASSPHRASE, VOLUME) is False
    assert not any("luksFormat" in c.argv for c in runner.calls)


@pytest.mark.parametrize("blkid", ["TYPE=ext4\nUSAGE=filesystem\n", "PTTYPE=gpt\n"])
def test_any_other_signature_is_refused_and_left_untouched(device: str, blkid: str) -> None:
    runner = cryptsetup(blkid=blkid)
    with pytest.raises(FailedPrecondition) as caught:
        luks.Luks(runner, 30).format(device, PASSPHRASE, VOLUME)
    assert "refusing to format" in caught.value.message and VOLUME in caught.value.message
    assert not any("luksFormat" in c.argv for c in runner.calls)


def test_open_passes_the_passphrase_on_stdin_without_the_kernel_keyring(device: str) -> None:
    runner = cryptsetup()
    path = luks.Luks(runner, 30).open(device, luks.dm_name(VOLUME), PASSPHRASE, VOLUME)
    assert path == f"/dev/mapper/luks-rbd-{VOLUME}"
    call = runner.calls[-1]
    assert call.argv == ["cryptsetup", "luksOpen", device, f"luks-rbd-{VOLUME}", "--disable-keyring", "--key-file=-"]
    assert call.stdin == PASSPHRASE


def test_open_read_only_opens_the_mapping_read_only(device: str) -> None:
    runner = cryptsetup()
    luks.Luks(runner, 30).open(device, "luks-rbd-x", PASSPHRASE, VOLUME, read_only=True)
    assert runner.calls[-1].argv[-1] == "--readonly"


def test_an_open_mapping_on_the_device_is_reused_and_one_on_another_refused() -> None:
    runner = cryptsetup(active=ACTIVE)
    assert luks.Luks(runner, 30).open("/dev/rbd0", "luks-rbd-x", PASSPHRASE, VOLUME) == "/dev/mapper/luks-rbd-x"
    assert not any("luksOpen" in c.argv for c in runner.calls)
    with pytest.raises(FailedPrecondition) as caught:
        luks.Luks(runner, 30).open("/dev/rbd1", "luks-rbd-x", PASSPHRASE, VOLUME)
    assert "/dev/rbd0" in caught.value.message and "cryptsetup close luks-rbd-x" in caught.value.message


def test_a_wrong_passphrase_is_permission_denied_without_the_passphrase(device: str) -> None:
    runner = cryptsetup(open_rc=2)
    with pytest.raises(PermissionDenied) as caught:
        luks.Luks(runner, 30).open(device, "luks-rbd-x", PASSPHRASE, VOLUME)
    assert "opens no keyslot" in caught.value.message
    assert PASSPHRASE not in caught.value.message


def test_close_is_idempotent() -> None:
    runner = cryptsetup()
    luks.Luks(runner, 30).close("luks-rbd-x")
    assert [c.argv[1] for c in runner.calls] == ["status"]
    runner = cryptsetup(active=ACTIVE)
    luks.Luks(runner, 30).close("luks-rbd-x")
    assert runner.calls[-1].argv == ["cryptsetup", "luksClose", "luks-rbd-x"]


def test_no_device_mapper_means_nothing_is_open() -> None:
    runner = FakeRunner(lambda argv: (1, "", "Cannot initialize device-mapper. Is dm_mod kernel module loaded?\n"))
    assert luks.Luks(runner, 30).status("luks-rbd-x") is None


def test_resize_needs_no_passphrase_and_reports_the_new_size() -> None:
    runner = cryptsetup(active=ACTIVE)
    assert luks.Luks(runner, 30).resize("luks-rbd-x") == 98304 * 512
    assert runner.calls[0].argv == ["cryptsetup", "resize", "luks-rbd-x"]
    assert runner.calls[0].stdin is None


def test_run_writes_stdin_to_the_child_and_scrubs_its_echo() -> None:
    result = node_exec.run(["wc", "-c"], what="count", stdin=PASSPHRASE, secrets=[PASSPHRASE])
    assert result.stdout.strip() == str(len(PASSPHRASE))
    echoed = node_exec.run(["cat"], what="echo", stdin=PASSPHRASE, secrets=[PASSPHRASE])
    assert echoed.stdout == "***"
