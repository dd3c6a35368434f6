from __future__ import annotations

import pytest

from cephcsi.errors import InvalidArgument
from cephcsi.node.mappers.options import merge, parse

pytestmark = pytest.mark.unit


def test_plain_list_applies_to_any_mapper() -> None:
    for mapper in ("krbd", "rbd-nbd", "fuse"):
        assert parse("lock_on_read, queue_depth=1024", mapper) == ["lock_on_read", "queue_depth=1024"]


def test_typed_lists() -> None:
    text = "krbd:lock_on_read,queue_depth=1024;nbd:try-netlink,io-timeout=30"
    assert parse(text, "krbd") == ["lock_on_read", "queue_depth=1024"]
    assert parse(text, "rbd-nbd") == ["try-netlink", "io-timeout=30"]
    assert parse(text, "fuse") == []
    assert parse("nbd:io-timeout=30", "krbd") == []


def test_empty() -> None:
    assert parse("", "krbd") == []
    assert parse("  ;  ", "krbd") == []


@pytest.mark.parametrize(
    "text, message",
    [
        ("ggate:x", "unknown mapper type 'ggate'"),
        ("krbd:a;krbd:b", "appear twice"),
        ("a,b;c", "more than one untyped"),
        ("a;krbd:b", "mixes a plain option list"),
        ("krbd:a b", "not allowed"),
        ("a'b", "not allowed"),
    ],
)
def test_errors(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as caught:
        parse(text, "krbd", "mapOptions")
    assert caught.value.message.startswith("mapOptions")


def test_merge_user_wins_by_key() -> None:
    assert merge(["try-netlink", "reattach-timeout=300"], ["reattach-timeout=30", "x"]) == [
        "try-netlink", "reattach-timeout=30", "x",
    ]
    assert merge(["noudev"], []) == ["noudev"]
