"""Section 2d's pure parts: the by-hand scripts, the guest's output, the header check, per-round ratios."""
from __future__ import annotations

import pytest

from bench.sections import by_name
from bench.sections.node_vm_crypt import (
    NAME,
    CryptTimings,
    header_note,
    manual_down_script,
    manual_up_script,
    parse_header,
    parse_write,
    ratios,
    tables,
    write_script,
)
from cephcsi.node.luks import FORMAT_OPTIONS

pytestmark = pytest.mark.unit

DUMP = """LUKS header information
Version:       \t2
UUID:          \t0d3c

Data segments:
  0: crypt
\toffset: 16777216 [bytes]
\tcipher: aes-xts-plain64
\tsector: 4096 [bytes]

Keyslots:
  0: luks2
\tKey:        512 bits
\tCipher:     aes-xts-plain64
\tPBKDF:      argon2id
Digests:
  0: pbkdf2
"""


def test_up_script_formats_with_the_drivers_options_only_over_no_signature() -> None:
    up = manual_up_script("krbd", "rbd/img", "/st", "/tg", "csi", "10.0.0.1:3300", "/run/k", "/run/luks", "luks-x")
    assert " ".join(FORMAT_OPTIONS) in up and "--key-file=/run/luks" in up
    assert "--force" not in up and "-F" not in up.split()
    assert up.index("blkid -p") < up.index("luksFormat") < up.index("luksOpen") < up.index("mkfs.ext4")
    assert "[ $rc -ne 2 ]" in up  # anything but blkid's "nothing found" refuses the format
    assert "--disable-keyring" in up and "mount -t ext4 /dev/mapper/luks-x /st/fs" in up


def test_down_script_closes_the_mapping_before_the_unmap() -> None:
    down = manual_down_script("nbd", "/dev/nbd0", "/st", "/tg", "luks-x")
    assert down.index("umount /tg") < down.index("umount /st/fs") < down.index("luksClose luks-x") \
        < down.index("unmap --device-type nbd /dev/nbd0")


def test_write_is_direct_and_synced_and_parsed_in_seconds() -> None:
    script = write_script("/tg", 64)
    assert "oflag=direct" in script and "conv=fsync" in script and "count=64" in script
    assert parse_write("noise\n2000000000\n") == 2.0


@pytest.mark.parametrize("text", ["", "dd: error", "0", "12 13"])
def test_unexpected_write_output_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_write(text)


def test_header_fields_come_from_the_data_segment_and_the_first_keyslot() -> None:
    assert parse_header(DUMP) == {"cipher": "aes-xts-plain64", "sector": "4096", "key bits": "512",
                                  "pbkdf": "argon2id"}


def test_header_note_says_when_the_sides_differ() -> None:
    same = parse_header(DUMP)
    assert header_note({"driver": [same], "manual": [same]}).startswith("LUKS2 headers, both sides alike")
    other = {**same, "sector": "512"}
    assert "DIFFER" in header_note({"driver": [same], "manual": [other]})


def test_write_ratio_is_the_drivers_throughput_over_the_by_hand_one() -> None:
    driver = CryptTimings([2.0], [0.1], [0.1], [1.0], write=[4.0])
    manual = CryptTimings([1.0], [0.1], [0.1], [1.0], write=[2.0])
    spreads = ratios({"krbd": {"driver": driver, "manual": manual}})
    write = spreads[("krbd", "write MiB/s")]
    assert write is not None and write.median == pytest.approx(0.5)
    up = spreads[("krbd", "stage+publish")]
    assert up is not None and up.median == pytest.approx(2.1 / 1.1)
    latency, throughput = tables("tcg", 1, {"krbd": {"driver": driver, "manual": manual}}, spreads)
    assert throughput.rows == [["krbd", "16.0 (16.0–16.0)", "32.0 (32.0–32.0)", "0.50× (0.50–0.50)"]]
    assert "ratios only" in latency.title and len(latency.rows) == 6
    assert driver.to_json()["write"] == [4.0]


def test_selectable_as_its_own_section() -> None:
    assert NAME in by_name()
