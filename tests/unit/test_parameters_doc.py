"""docs/parameters.md against the code: every flag and every parameter or config key the code
accepts has a row, no row names one the code no longer has, and each flag's documented default
is the parser's.

The names come from the code's own tables (argparse parsers, KNOWN_KEYS, config/ignored.py), so
a flag or key added anywhere shows up here without editing this file. The doc's convention: in
the section a check reads, the first cell of each table row holds the names (in backticks);
a flag row's second cell holds its default (a backticked value, `required`, or `—` for none).
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cephcsi.cli
from cephcsi.ceph import credentials
from cephcsi.config import ignored, read_affinity
from cephcsi.csi import node as csi_node
from cephcsi.node import volume_source
from cephcsi.sidecars.provisioner import names as provisioner_names, request as provision_request
from cephcsi.sidecars.snapshotter import content as snapshot_content
from cephcsi.volumes import parameters, snapshots

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "parameters.md"
_HEADING = re.compile(r"^(#{2,3}) (.+?)\s*$")
_NAME = re.compile(r"`([^`]+)`")


def _sections(text: str) -> dict[str, str]:
    """Heading text → its body, up to the next heading of the same or a higher level."""
    lines = text.splitlines()
    starts = [(i, len(m.group(1)), m.group(2)) for i, line in enumerate(lines) if (m := _HEADING.match(line))]
    found: dict[str, str] = {}
    for n, (start, level, title) in enumerate(starts):
        end = next((s for s, lv, _ in starts[n + 1:] if lv <= level), len(lines))
        found[title] = "\n".join(lines[start + 1:end])
    return found


def _rows(body: str) -> Iterator[list[str]]:
    """Cells of each table row that is neither a header nor a separator."""
    previous_was_table = False
    for line in body.splitlines():
        stripped = line.strip()
        if not stripped.startswith("|"):
            previous_was_table = False
            continue
        cells = [cell.strip() for cell in stripped.strip("|").split("|")]
        is_separator = all(re.fullmatch(r":?-+:?", cell) for cell in cells if cell)
        if previous_was_table and not is_separator:
            yield cells
        previous_was_table = True
        # The first row of a table is its header: skipped because previous_was_table was False.


def _names(body: str) -> list[str]:
    return [name for cells in _rows(body) for name in _NAME.findall(cells[0])]


@pytest.fixture(scope="module")
def doc() -> dict[str, str]:
    assert DOC.is_file(), f"{DOC} is missing"
    return _sections(DOC.read_text(encoding="utf-8"))


def _section(doc: dict[str, str], title: str) -> str:
    assert title in doc, f"docs/parameters.md has no section '{title}' (sections: {sorted(doc)})"
    return doc[title]


def _compare(documented: list[str], accepted: set[str], where: str) -> None:
    duplicates = sorted({name for name in documented if documented.count(name) > 1})
    missing = sorted(accepted - set(documented))
    stale = sorted(set(documented) - accepted)
    assert not (missing or stale or duplicates), (
        f"docs/parameters.md, {where}: missing rows for {missing}; rows for names the code does not have "
        f"{stale}; listed twice {duplicates}"
    )


# ---- flags ------------------------------------------------------------------------------------


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser: the modules of cephcsi.cli that define build_parser()."""
    found = {}
    for module_info in pkgutil.iter_modules(cephcsi.cli.__path__):
        module = importlib.import_module(f"cephcsi.cli.{module_info.name}")
        build = getattr(module, "build_parser", None)
        if callable(build):
            parser = build()
            assert isinstance(parser, argparse.ArgumentParser)
            found[parser.prog] = parser
    return found


PARSERS = _parsers()


def _flag_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_the_commands_found_are_the_driver_and_the_audit() -> None:
    # Guards the discovery itself: an import path change must not make the flag checks vacuous.
    assert {"cephcsi", "cephcsi audit"} <= set(PARSERS)


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_every_flag_has_a_row(doc: dict[str, str], prog: str) -> None:
    flags = {option for action in _flag_actions(PARSERS[prog]) for option in action.option_strings}
    _compare(_names(_section(doc, f"`{prog}` flags")), flags, f"`{prog}` flags")


def test_no_flag_section_without_a_command(doc: dict[str, str]) -> None:
    sections = {title[1:-len("` flags")] for title in doc if title.startswith("`") and title.endswith("` flags")}
    assert sections <= set(PARSERS), f"flag sections for commands the code lacks: {sorted(sections - set(PARSERS))}"


def _documented_default(cell: str, action: argparse.Action) -> Any:
    if cell.startswith("—"):
        return None
    if cell.startswith("required"):
        return "required"
    match = _NAME.search(cell)
    assert match, f"{action.option_strings[0]}: default cell {cell!r} holds no `value`, 'required' or '—'"
    text = match.group(1)
    if text == '""':
        return ""
    if isinstance(action.default, bool) and action.type is None:  # store_true
        return {"true": True, "false": False}.get(text, text)
    return action.type(text) if callable(action.type) else text


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_every_flag_default_is_the_parsers(doc: dict[str, str], prog: str) -> None:
    rows = {name: cells for cells in _rows(_section(doc, f"`{prog}` flags")) for name in _NAME.findall(cells[0])}
    wrong = []
    for action in _flag_actions(PARSERS[prog]):
        cells = rows.get(action.option_strings[0])
        if cells is None:
            continue  # reported by test_every_flag_has_a_row
        assert len(cells) >= 3, f"{action.option_strings[0]}: the row needs name, default and description cells"
        expected = "required" if action.required else (
            None if action.default in (None, argparse.SUPPRESS) else action.default)
        documented = _documented_default(cells[1], action)
        if documented != expected:
            wrong.append(f"{action.option_strings[0]}: doc says {cells[1]!r}, the parser {expected!r}")
        missing_choices = [c for c in action.choices or () if f"`{c}`" not in " ".join(cells)]
        if missing_choices:
            wrong.append(f"{action.option_strings[0]}: choices {missing_choices} not named in its row")
    assert not wrong, "docs/parameters.md:\n" + "\n".join(wrong)


# ---- parameters, attributes, secrets, config.json ----------------------------------------------


def test_storage_class_parameters(doc: dict[str, str]) -> None:
    # What CreateVolume accepts, plus the reserved keys the embedded provisioner reads itself.
    accepted = set(parameters.KNOWN_KEYS) | set(provision_request.KNOWN_RESERVED_KEYS)
    _compare(_names(_section(doc, "StorageClass parameters")), accepted, "StorageClass parameters")


def test_volume_snapshot_class_parameters(doc: dict[str, str]) -> None:
    accepted = set(snapshots.KNOWN_KEYS) | {
        snapshot_content.SECRET_NAME, snapshot_content.SECRET_NAMESPACE,
        snapshot_content.LIST_SECRET_NAME, snapshot_content.LIST_SECRET_NAMESPACE,
    }
    _compare(_names(_section(doc, "VolumeSnapshotClass parameters")), accepted, "VolumeSnapshotClass parameters")


def _constants(module: object, prefix: str) -> set[str]:
    return {value for name, value in vars(module).items() if name.startswith(prefix) and isinstance(value, str)}


def test_volume_attributes(doc: dict[str, str]) -> None:
    # What CreateVolume writes (every optional part set), what the node plugin reads, and the
    # provisioner's identity key.
    written = parameters.VolumeParameters(
        cluster_id="c", pool="p", data_pool="d", node_options=tuple((k, "x") for k in parameters.NODE_KEYS),
    ).volume_context("image", "namespace")
    read = _constants(csi_node, "CTX_") | _constants(volume_source, "CTX_") | {volume_source.STATIC_VOLUME_KEY}
    accepted = set(written) | read | {provisioner_names.PROVISIONER_IDENTITY_KEY}
    _compare(_names(_section(doc, "PersistentVolume volumeAttributes")), accepted, "PersistentVolume volumeAttributes")


def test_secrets(doc: dict[str, str]) -> None:
    _compare(_names(_section(doc, "Secrets")), {credentials.USER_ID_KEY, credentials.USER_KEY_KEY}, "Secrets")


def test_config_json_keys_read(doc: dict[str, str]) -> None:
    read = (set(ignored.USED) | {f"rbd.{k}" for k in ignored.USED_RBD}
            | {f"{read_affinity.KEY}.{k}" for k in ignored.USED_READ_AFFINITY})
    _compare(_names(_section(doc, "Keys cephcsi reads")), read, "config.json keys cephcsi reads")


def test_config_json_keys_ignored(doc: dict[str, str]) -> None:
    skipped = set(ignored.IGNORED) | {f"rbd.{k}" for k in ignored.IGNORED_RBD}
    _compare(_names(_section(doc, "ceph-csi keys accepted and ignored")), skipped, "config.json keys ignored")


# ---- the checks themselves ---------------------------------------------------------------------


def test_the_table_reader_sees_rows_and_skips_headers() -> None:
    body = "text `notme`\n\n| key | what |\n|---|---|\n| `a`, `b` | x `notme` |\n| `c` | y |\n"
    assert _names(body) == ["a", "b", "c"]


def test_a_missing_or_stale_name_fails() -> None:
    with pytest.raises(AssertionError, match=r"missing rows for \['b'\]"):
        _compare(["a"], {"a", "b"}, "t")
    with pytest.raises(AssertionError, match=r"code does not have \['z'\]"):
        _compare(["a", "z"], {"a"}, "t")
    with pytest.raises(AssertionError, match=r"listed twice \['a'\]"):
        _compare(["a", "a"], {"a"}, "t")


def test_sections_end_at_the_next_heading_of_their_level() -> None:
    text = "## A\n| h |\n|-|\n| `x` |\n### A1\n| h |\n|-|\n| `y` |\n## B\n| h |\n|-|\n| `z` |\n"
    found = _sections(text)
    assert _names(found["A"]) == ["x", "y"] and _names(found["A1"]) == ["y"] and _names(found["B"]) == ["z"]
