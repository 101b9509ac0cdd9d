"""#11 item 5 / #16: the fast path's JSON trick (``hook.routes.fastpath.loads``) against ``json.loads``.

Inputs are the examples' real config.json files (and states made from them), truncated at any
byte, with bytes flipped, inserted or repeated, wrapped in deep nesting, given huge integers,
invalid UTF-8, BOMs and NULs. On every input the two must agree: the same value when
``json.loads`` decodes it, the same kind of failure (ValueError or RecursionError) when it does
not. CI runs ``ODH_FUZZ_EXAMPLES`` (default 1,000) examples; ``tests/fuzz/run`` runs well over
100k and docs/testing.md ("Fuzz") records the last result.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hook.routes.fastpath import loads as _loads

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEEDS = [p.read_bytes() for p in sorted(EXAMPLES.glob("*/config.json"))] + [
    json.dumps(
        {
            "ociVersion": "1.1.0",
            "id": "c-\u00e9\u2028",
            "pid": 42,
            "bundle": "/b",
            "annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"},
        }
    ).encode(),
]
EXAMPLES_N = int(os.environ.get("ODH_FUZZ_EXAMPLES", "1000"))
# Bytes that steer the scanner into its corners: structure, escapes, numbers, literals, encodings.
TOKENS = [
    b'"',
    b"\\",
    b"\\u",
    b"\\ud800",
    b"\\udc00",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"-",
    b"0",
    b"1e999",
    b"1.",
    b"e",
    b"+",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"true",
    b"null",
    b" ",
    b"\t",
    b"\n",
    b"\x00",
    b"\x1f",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"\xef\xbb\xbf",
    b"\xff\xfe",
    b"9" * 4301,
    b"[" * 1100,
    b'{"a":' * 1100,
]


def same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN, same types (1 is not 1.0, True is not 1); no recursion,
    so 2,000-deep values compare too."""
    todo = [(a, b)]
    while todo:
        x, y = todo.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, float):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
        elif isinstance(x, dict):
            if list(x) != list(y):
                return False
            todo += [(x[k], y[k]) for k in x]
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            todo += list(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


def outcome(fn: Any, data: bytes) -> tuple[str, Any]:
    try:
        return "value", fn(data)
    except RecursionError:
        return "RecursionError", None
    except ValueError:
        return "ValueError", None


def check(data: bytes) -> None:
    """Same value, or the same failure. A RecursionError on either side is the one exception:
    where Python's stack runs out depends on how deep the caller already is (``_loads``'s
    fallback calls ``json.loads`` one frame deeper), and any failure of ``_loads`` makes the
    fast path fall through to the full path, which decodes deep input itself (``hook.core.oci``)."""
    want, got = outcome(json.loads, data), outcome(_loads, data)
    if "RecursionError" in (want[0], got[0]) and "value" not in (want[0], got[0]):
        return
    assert want[0] == got[0], (data[:200], want[0], got[0])
    assert same(want[1], got[1]), data[:200]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "repeat", "wrap"]))
        at = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            data[min(at, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.sampled_from(TOKENS) | st.binary(max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif op == "repeat":
            data[at:at] = data[at : at + draw(st.integers(1, 64))] * draw(st.integers(1, 4))
        else:
            depth = draw(st.sampled_from([1, 10, 999, 2000]))
            data = bytearray(b"[" * depth + bytes(data) + b"]" * depth)
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]  # truncated anywhere
    return bytes(data)


@settings(max_examples=EXAMPLES_N, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(mutated())
def test_loads_agrees_with_json_loads(data: bytes) -> None:
    check(data)


def test_every_seed_prefix_agrees() -> None:
    """Every truncation of every real config (the SystemError family lives here)."""
    for seed in SEEDS:
        for end in range(0, len(seed) + 1, max(1, len(seed) // 400)):
            check(seed[:end])


def test_known_corners() -> None:
    for data in [
        b'"\\u12',
        b'"\\',
        b'{"a":"\\u00',
        b'"a',
        b'{"\\u',
        b"1" * 5000,
        b"[" * 2000 + b"]" * 2000,
        b'{"x":"\xff"}',
        b"\xef\xbb\xbf{}",
        b"\x00{}",
        b"{}\x00",
        b"NaN",
        b"[1e999]",
        b"",
    ]:
        check(data)
