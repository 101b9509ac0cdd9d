"""mig-minors parsing and existence filtering (hook.sources.nvidia.migminors)."""

from __future__ import annotations

import pytest

from hook.core.errors import InputError
from hook.sources.nvidia.migminors import (
    build_cap_table,
    ci_cap_name,
    dev_cap_path,
    gi_cap_name,
    parse_mig_minors,
    proc_cap_path,
)
from hook.sources.nvidia.model import CapNode
from tests.hosttree import cap_minor, mig_minors_text


def test_toolkit_vectors() -> None:
    m = parse_mig_minors("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n")
    assert (m.config, m.monitor) == (1, 2)
    assert dict(m.gi) == {(0, 0): 3}
    assert dict(m.ci) == {(0, 0, 0): 4}
    assert m.warnings == ()


def test_full_listing_follows_driver_layout() -> None:
    m = parse_mig_minors(mig_minors_text())
    assert len(m.gi) == 32 * 15 and len(m.ci) == 32 * 15 * 8
    assert m.gi[(1, 0)] == 138 and m.ci[(1, 0, 0)] == 139
    assert m.gi[(0, 1)] == 12 and m.ci[(0, 2, 0)] == 22
    assert m.ci[(31, 14, 7)] == cap_minor(31, 14, 7) == 4322


@pytest.mark.parametrize(
    "line",
    [
        "notconfig 99",
        "config notanint",
        "gpu0/gi0/bogus 5",
        "gpu0/gi0/access",
        "config 1 2",
        "gpuX/gi0/access 3",
    ],
    ids=["unknown name", "non-numeric minor", "unknown suffix", "no minor", "three fields", "bad gpu"],
)
def test_unknown_lines_are_skipped_with_a_warning(line: str) -> None:
    m = parse_mig_minors(f"config 1\n{line}\nmonitor 2\n", "mm")
    assert (m.config, m.monitor) == (1, 2)
    assert not m.gi and not m.ci
    assert len(m.warnings) == 1 and m.warnings[0].startswith("mm: line 2:") and repr(line) in m.warnings[0]


def test_blank_lines_and_tabs() -> None:
    m = parse_mig_minors("\nconfig\t1\n\n")
    assert m.config == 1 and m.warnings == ()


def test_duplicate_is_an_error_naming_file_and_line() -> None:
    with pytest.raises(InputError) as info:
        parse_mig_minors("config 1\ngpu0/gi1/access 12\ngpu0/gi1/access 13\n", "/proc/x/mig-minors")
    assert info.value.file == "/proc/x/mig-minors" and info.value.field == "line 3"


def test_names_and_paths() -> None:
    assert gi_cap_name(3, 1) == "gpu3/gi1/access"
    assert ci_cap_name(3, 1, 2) == "gpu3/gi1/ci2/access"
    assert proc_cap_path("config") == "proc/driver/nvidia/capabilities/mig/config"
    assert proc_cap_path("gpu3/gi1/ci2/access") == "proc/driver/nvidia/capabilities/gpu3/mig/gi1/ci2/access"
    assert dev_cap_path(13) == "dev/nvidia-caps/nvidia-cap13"
    names = parse_mig_minors("monitor 2\ngpu1/gi2/access 156\n").names()
    assert names == {"monitor": 2, "gpu1/gi2/access": 156}


def test_cap_counts_only_if_file_or_node_exists() -> None:
    minors = parse_mig_minors(mig_minors_text())
    proc = {"config": CapNode(minor=1, mode=0o400), "gpu0/gi1/access": CapNode(minor=12)}
    dev = {13: CapNode(minor=13, mode=0o440, gid=44), 2: CapNode(minor=2)}
    table, warnings = build_cap_table(minors, proc, dev)
    assert table.config == CapNode(minor=1, mode=0o400)
    assert table.monitor == CapNode(minor=2)
    assert dict(table.gi) == {(0, 1): CapNode(minor=12)}
    assert dict(table.ci) == {(0, 1, 0): CapNode(minor=13, mode=0o440, gid=44)}
    assert table.instances() == ((0, 1, 0),)
    assert warnings == ()


def test_capability_file_minor_wins_with_warning() -> None:
    minors = parse_mig_minors("config 1\n")
    table, warnings = build_cap_table(minors, {"config": CapNode(minor=7, mode=0o400)}, {})
    assert table.config is not None and table.config.minor == 7
    assert len(warnings) == 1 and "DeviceFileMinor 7" in warnings[0]


def test_ci_without_gi_is_not_an_instance() -> None:
    minors = parse_mig_minors("gpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n")
    table, _ = build_cap_table(minors, {}, {13: CapNode(minor=13)})
    assert dict(table.ci) and table.instances() == ()


def test_duplicate_in_a_file_with_junk() -> None:
    with pytest.raises(InputError) as info:
        parse_mig_minors("junk\nmonitor 2\n\nmonitor 3\n", "mm")
    assert info.value.field == "line 4"


def test_cap_key() -> None:
    from hook.sources.nvidia.migminors import cap_key

    assert cap_key("gpu7/gi3/access") == (7, 3)
    assert cap_key("gpu7/gi3/ci1/access") == (7, 3, 1)
    assert cap_key("config") == ()


def test_dev_node_for_unlisted_minor_is_ignored() -> None:
    table, _ = build_cap_table(parse_mig_minors("config 1\n"), {}, {99: CapNode(minor=99)})
    assert table == build_cap_table(parse_mig_minors(""), {}, {})[0]
