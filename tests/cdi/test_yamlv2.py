"""go-yaml v2 scalars and Go's float text: what the CDI reference makes of a spec's YAML."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hook.sources.cdi.yamlv2 import DuplicateKey, format_key, go_float32, load, resolve_plain


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1:0", "1:0"),  # no base 60 in go-yaml v2
        ("190:20:30", "190:20:30"),
        ("0", 0),
        ("-0", 0),
        ("+5", 5),
        ("010", 8),  # strconv.ParseInt base 0: a leading zero is octal
        ("08", 8.0),  # not octal, not int: a float by the YAML float pattern
        ("0x1F", 31),
        ("0o17", 15),
        ("0b101", 5),
        ("-0b101", -5),
        ("1_000", 1000),
        ("1.5", 1.5),
        ("1e3", 1000.0),
        (".5", 0.5),
        (".inf", math.inf),
        ("-.Inf", -math.inf),
        ("yes", True),
        ("On", True),
        ("n", False),
        ("OFF", False),
        ("tRUE", "tRUE"),
        ("~", None),
        ("", None),
        ("Null", None),
        ("2024-01-02", "2024-01-02T00:00:00Z"),
        ("2024-1-2 3:04:05.5", "2024-01-02T03:04:05.5Z"),
        ("2024-01-02T03:04:05+00:00", "2024-01-02T03:04:05Z"),
        ("2024-02-30", "2024-02-30"),  # not a date: stays text
        ("GPU-0", "GPU-0"),
        ("-", "-"),
        ("0x", "0x"),
    ],
)
def test_resolve_plain(text: str, value: Any) -> None:
    got = resolve_plain(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (0.1, "0.1"),
        (1.5, "1.5"),
        (123456.0, "123456"),
        (1e6, "1e+06"),
        (1234567.0, "1.234567e+06"),
        (1e-5, "1e-05"),
        (0.0001, "0.0001"),
        (3.14159265, "3.1415927"),  # float32 precision, as FormatFloat(v, 'g', -1, 32)
        (16777217.0, "1.6777216e+07"),
        (-2.5, "-2.5"),
        (-0.0, "-0"),
        (math.inf, "+Inf"),
        (1e39, "+Inf"),  # beyond float32
        (math.nan, "NaN"),
    ],
)
def test_go_float32(value: float, text: str) -> None:
    assert go_float32(value) == text


def test_keys_become_json_keys() -> None:
    assert [format_key(k) for k in ("a", 1, True, 1.5, math.inf)] == ["a", "1", "true", "1.5", ".inf"]
    with pytest.raises(ValueError, match="unsupported map key"):
        format_key(None)


def test_quoted_and_tagged_scalars_stay_strings() -> None:
    doc = load(b"a: '0'\nb: \"yes\"\nc: !!str 1:0\nd: !!float 1\ne: !custom 5\n")
    assert doc == {"a": "0", "b": "yes", "c": "1:0", "d": 1.0, "e": "5"}
    with pytest.raises(ValueError, match="cannot decode"):
        load(b"a: !!int yes\n")


def test_first_document_only_and_empty() -> None:
    assert load(b"a: 1\n---\nb: [unclosed\n") == {"a": 1}
    assert load(b"") is None and load(b"# nothing\n") is None


def test_duplicates_after_resolution() -> None:
    with pytest.raises(DuplicateKey):
        load(b"a: 1\na: 2\n")
    with pytest.raises(DuplicateKey):
        load(b"1: a\n\"1\": b\n")  # one JSON key "1": refused rather than keeping one at random
    with pytest.raises(DuplicateKey):
        load(b'{"a": 1, "a": 2}')


def test_merge_keys() -> None:
    assert load(b"base: &b {x: 1, z: 2}\nm:\n  <<: *b\n  z: 3\n")["m"] == {"x": 1, "z": 3}


def test_json_fast_path_matches_yaml() -> None:
    text = b'{"a": [1, 2.5, "x", true, null], "b": {"c": 1e3}}'
    assert load(text) == load(text.replace(b"{", b"{ ", 1) + b"\n# a comment makes it YAML-only\n")


def test_alias_bombs_are_refused() -> None:
    rows = [b"a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]".encode() for i in range(1, 7)]
    with pytest.raises(ValueError, match="too deep or too large"):
        load(b"\n".join(rows) + b"\n")
