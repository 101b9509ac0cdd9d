"""Qualified names, annotation requests and env IDs (hook.core.cdinames)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hook.core.cdinames import (
    env_id_to_name,
    is_qualified_name,
    parse_annotations,
    parse_kind,
    parse_qualified_name,
)
from hook.core.errors import InputError

VALID = [
    ("vendor.com/class=dev", ("vendor.com", "class", "dev")),
    ("a/b=c", ("a", "b", "c")),
    ("vendor.com/class=0", ("vendor.com", "class", "0")),
    ("vendor1.com/class.subclass=dev1", ("vendor1.com", "class.subclass", "dev1")),
    ("other-vendor1.com/class_1=dev_1", ("other-vendor1.com", "class_1", "dev_1")),
    ("yet_another-vendor2.com/c-lass_2=dev_1:2.3", ("yet_another-vendor2.com", "c-lass_2", "dev_1:2.3")),
    (
        "nvidia.com/gpu=MIG-f1e2d3c4-b5a6-5978-8695-a4b3c2d1e0f9",
        ("nvidia.com", "gpu", "MIG-f1e2d3c4-b5a6-5978-8695-a4b3c2d1e0f9"),
    ),
    ("vendor.com/class=a=b", None),  # split at the first "=": name "a=b" is invalid
]
INVALID = [
    "_invalid.com/class=dev",
    "invalid2.com-/class=dev",
    "invalid3.com/_class=dev",
    "invalid4.com/class_=dev",
    "invalid5.com/class=-dev",
    "invalid6.com/class=dev:",
    "*.com/*dev=*gpu*",
    "vendor3.com=device3",
    "/dev/null",
    "",
    "vendor.com/foo/bar=dev",
    "vendor.com/class=",
    "vendor.com/=dev",
    "=dev",
    "vendor.com/class=dev\n",
]


@pytest.mark.parametrize(("text", "parts"), VALID, ids=[v[0] for v in VALID])
def test_valid_names(text: str, parts: tuple[str, str, str] | None) -> None:
    if parts is None:
        assert not is_qualified_name(text)
    else:
        assert parse_qualified_name(text) == parts
        assert is_qualified_name(text)


@pytest.mark.parametrize("text", INVALID, ids=repr)
def test_invalid_names(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_qualified_name(text, source="req", field="x")
    assert (info.value.file, info.value.field) == ("req", "x")


def test_error_names_the_bad_part() -> None:
    with pytest.raises(InputError, match="invalid device name"):
        parse_qualified_name("vendor.com/class=-dev")
    with pytest.raises(InputError, match="invalid class"):
        parse_qualified_name("vendor.com/_class=dev")
    with pytest.raises(InputError, match="missing class"):
        parse_qualified_name("vendor3.com=device3")


def test_parse_kind() -> None:
    assert parse_kind("foo.bar.baz/foo-bar123.B_az") == ("foo.bar.baz", "foo-bar123.B_az")
    for bad in ("foo", "vendor.com/foo/", "vendor.com/foo/bar"):
        with pytest.raises(InputError) as info:
            parse_kind(bad, source="s.json")
        assert (info.value.file, info.value.field) == ("s.json", "kind")


_SEG = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")


@given(st.text(alphabet="ab0_.-:=/ \nZ", max_size=16))
def test_parser_agrees_with_the_grammar(text: str) -> None:
    kind, eq, name = text.partition("=")
    vendor, slash, class_ = kind.partition("/")
    expected = bool(
        eq and slash and _SEG.fullmatch(vendor) and _SEG.fullmatch(class_) and _NAME.fullmatch(name)
    )
    assert is_qualified_name(text) == expected
    if expected:
        assert "=".join(("/".join(parse_qualified_name(text)[:2]), name)) == text


@given(
    st.from_regex(_SEG, fullmatch=True),
    st.from_regex(_SEG, fullmatch=True),
    st.from_regex(_NAME, fullmatch=True),
)
def test_round_trip(vendor: str, class_: str, name: str) -> None:
    assert parse_qualified_name(f"{vendor}/{class_}={name}") == (vendor, class_, name)


def test_annotations_sorted_and_filtered() -> None:
    ann = {"cdi.k8s.io/z_dev": "v.com/c=b", "other": "x", "cdi.k8s.io/a_dev": "v.com/c=a,v.com/c=a"}
    assert parse_annotations(ann) == (
        ("cdi.k8s.io/a_dev", ("v.com/c=a", "v.com/c=a")),
        ("cdi.k8s.io/z_dev", ("v.com/c=b",)),
    )


def test_annotations_custom_prefix() -> None:
    ann = {"cdi.k8s.io/x": "v.com/c=a", "nvidia.cdi.k8s.io/y": "v.com/c=b"}
    assert parse_annotations(ann, prefixes=("nvidia.cdi.k8s.io/",)) == (
        ("nvidia.cdi.k8s.io/y", ("v.com/c=b",)),
    )


@pytest.mark.parametrize("value", ["v.com/c=a,/dev/null", "v.com/c=a, v.com/c=b", "vendor3.com=device3", ""])
def test_bad_annotation_element_fails_that_annotation(value: str) -> None:
    with pytest.raises(InputError) as info:
        parse_annotations({"cdi.k8s.io/plugin_x": value, "cdi.k8s.io/ok": "v.com/c=a"})
    assert info.value.file == "config.json"
    assert info.value.field == "annotations['cdi.k8s.io/plugin_x']"
    assert "invalid CDI device name" in info.value.reason


@pytest.mark.parametrize(
    ("device_id", "kind", "expected"),
    [
        ("0", "nvidia.com/gpu", "nvidia.com/gpu=0"),
        ("0:1", "nvidia.com/gpu", "nvidia.com/gpu=0:1"),
        (
            "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
            "nvidia.com/gpu",
            "nvidia.com/gpu=GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
        ),
        ("all", "management.nvidia.com/gpu", "management.nvidia.com/gpu=all"),
        ("vendor.com/class=dev", "nvidia.com/gpu", "vendor.com/class=dev"),
    ],
)
def test_env_id_to_name(device_id: str, kind: str, expected: str) -> None:
    assert env_id_to_name(device_id, kind) == expected


@pytest.mark.parametrize("device_id", ["", "-1", "0:", "a b"])
def test_env_id_invalid(device_id: str) -> None:
    with pytest.raises(InputError):
        env_id_to_name(device_id)
