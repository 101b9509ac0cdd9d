"""The string-method parsers in hook.sources.nvidia.ids and hook.sources.nvidia.migminors equal the
patterns they
replaced (compiling those cost every start), on generated and hand-picked inputs."""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hook.sources.nvidia.ids import normalize_bus_id, parse_bus_id, parse_mig_index, parse_old_mig
from hook.sources.nvidia.migminors import cap_key

BUS = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])")
MIG_INDEX = re.compile(r"(\d+):(\d+)")
OLD_MIG = re.compile(r"mig-(gpu-[0-9a-f-]+)/(\d+)/(\d+)")
GI = re.compile(r"gpu(\d+)/gi(\d+)/access")
CI = re.compile(r"gpu(\d+)/gi(\d+)/ci(\d+)/access")

# Characters the patterns care about, plus near misses: other Unicode digits (\d takes them),
# upper-case hex, whitespace, separators, letters of the literal words.
OTHER_DIGITS = "\u0663\uff15\u0661\u0662"  # Arabic-Indic 3, fullwidth 5, Arabic-Indic 1 and 2
ALPHABET = "0123456789abcdefgABF:.-/ \tx" + OTHER_DIGITS + "migpuacesgi"
text = st.text(alphabet=ALPHABET, max_size=24)


def _bus_pieces() -> st.SearchStrategy[str]:
    hexes = st.text(alphabet="0123456789abcdefAB" + OTHER_DIGITS, min_size=0, max_size=9)
    fn = st.sampled_from("0123456789a" + OTHER_DIGITS)
    sep = st.sampled_from([":", "", "::"])
    return st.builds(lambda d, b, v, f, s: f"{d}{s}{b}:{v}.{f}", hexes, hexes, hexes, fn, sep)


def ref_bus(low: str) -> tuple[str, str, str, str] | None:
    m = BUS.fullmatch(low)
    return None if m is None else (m[1] or "", m[2], m[3], m[4])


@settings(max_examples=3000)
@given(st.one_of(text, _bus_pieces()))
@example("0000:3b:00.0")
@example("00000000:3B:00.0")
@example("3b:00.0")
@example(":3b:00.0")
@example("000000000:3b:00.0")
@example("0000:3b:00.8")
@example("0000:3b:00.0.0")
def test_bus_id_parser_equals_the_pattern(value: str) -> None:
    low = value.strip().lower()
    assert parse_bus_id(low) == ref_bus(low)
    try:
        got: str | None = normalize_bus_id(value)
    except ValueError:
        got = None
    m = BUS.fullmatch(low)
    want = None if m is None else f"{int(m[1] or '0', 16):04x}:{int(m[2], 16):02x}:{int(m[3], 16):02x}.{m[4]}"
    assert got == want


@settings(max_examples=3000)
@given(text)
@example("1:2")
@example("\u0661:\u0662")
@example("1:2:3")
@example(":2")
@example("12")
def test_index_and_mig_index_parsers_equal_the_patterns(value: str) -> None:
    assert value.isdecimal() == (re.fullmatch(r"\d+", value) is not None)
    m = MIG_INDEX.fullmatch(value)
    assert parse_mig_index(value) == (None if m is None else (int(m[1]), int(m[2])))


def _old_mig() -> st.SearchStrategy[str]:
    uuid = st.text(alphabet="0123456789abcdefg-/", max_size=12)
    num = st.text(alphabet="0123456789x/" + OTHER_DIGITS, max_size=3)
    return st.builds(lambda u, a, b: f"mig-gpu-{u}/{a}/{b}", uuid, num, num)


@settings(max_examples=3000)
@given(st.one_of(text, _old_mig()))
@example("mig-gpu-3f2b9c41-7d0e/1/0")
@example("mig-gpu-/1/0")
@example("mig-gpu-a/1/0/2")
@example("mig-gpu-a/\u0663/0")
def test_old_mig_parser_equals_the_pattern(value: str) -> None:
    m = OLD_MIG.fullmatch(value)
    assert parse_old_mig(value) == (None if m is None else (m[1], int(m[2]), int(m[3])))


def _cap_names() -> st.SearchStrategy[str]:
    num = st.text(alphabet="0123456789x" + OTHER_DIGITS, max_size=3)
    return st.builds(lambda g, i, c, tail, ci: f"gpu{g}/gi{i}" + (f"/ci{c}" if ci else "") + tail,
                     num, num, num, st.sampled_from(["/access", "/access/", "access", "/acces", ""]),
                     st.booleans())  # fmt: skip


def ref_cap_key(name: str) -> tuple[int, ...]:
    if m := CI.fullmatch(name):
        return (int(m[1]), int(m[2]), int(m[3]))
    if m := GI.fullmatch(name):
        return (int(m[1]), int(m[2]))
    return ()


@settings(max_examples=3000)
@given(st.one_of(text, _cap_names()))
@example("gpu0/gi1/access")
@example("gpu0/gi1/ci2/access")
@example("gpu0/gi1/ci2/ci3/access")
@example("gpu/gi1/access")
@example("config")
def test_cap_key_equals_the_patterns(name: str) -> None:
    assert cap_key(name) == ref_cap_key(name)
