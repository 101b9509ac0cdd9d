"""hook.core.record: the frozen value classes every module uses, checked against what dataclasses promise."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hook.core.record import FrozenInstanceError, asdict, field, fields, record, replace


@record
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()
    note: str = field(default="", compare=False, repr=False)
    seen: list[int] = field(default_factory=list, compare=False)


@record(kw_only=False)
class Pair:
    a: int
    b: str = "b"


@record
class Checked:
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n must be >= 0")


def test_keyword_only_by_default() -> None:
    assert Point(x=1).y == 0
    with pytest.raises(TypeError, match="keyword arguments only"):
        Point(1)  # type: ignore[misc]


def test_positional_records_take_declaration_order() -> None:
    assert Pair(1, "z") == Pair(a=1, b="z")
    assert Pair(2).b == "b"
    with pytest.raises(TypeError, match="multiple values"):
        Pair(1, a=2)  # type: ignore[misc]


def test_missing_and_unknown_arguments_are_type_errors() -> None:
    with pytest.raises(TypeError, match="missing required argument 'x'"):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected arguments"):
        Point(x=1, z=2)  # type: ignore[call-arg]


def test_frozen_and_slotted() -> None:
    p = Point(x=1)
    with pytest.raises(FrozenInstanceError):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        del p.x  # type: ignore[misc]
    assert not hasattr(p, "__dict__")


def test_default_factory_gives_each_instance_its_own() -> None:
    a, b = Point(x=1), Point(x=1)
    a.seen.append(1)
    assert b.seen == []


def test_equality_and_hash_skip_uncompared_fields() -> None:
    assert Point(x=1, note="a") == Point(x=1, note="b")
    assert hash(Point(x=1, note="a")) == hash(Point(x=1, note="b"))
    assert Point(x=1) != Point(x=2)
    assert Point(x=1) != Pair(1)
    assert len({Point(x=1), Point(x=1, tags=("t",))}) == 2


def test_repr_hides_repr_false_fields() -> None:
    assert repr(Point(x=1, note="secret")) == "Point(x=1, y=0, tags=(), seen=[])"


def test_post_init_validates() -> None:
    with pytest.raises(ValueError, match="n must be"):
        Checked(n=-1)


def test_replace_fields_asdict() -> None:
    p = replace(Point(x=1, tags=("a",)), y=5)
    assert (p.x, p.y, p.tags) == (1, 5, ("a",))
    with pytest.raises(TypeError, match="no fields"):
        replace(p, nope=1)
    assert [f.name for f in fields(Point)] == ["x", "y", "tags", "note", "seen"]
    assert asdict((Pair(1), [Point(x=2)])) == (
        {"a": 1, "b": "b"},
        [{"x": 2, "y": 0, "tags": (), "note": "", "seen": []}],
    )


def test_match_args_allow_positional_patterns() -> None:
    match Pair(3, "q"):
        case Pair(a, b):
            assert (a, b) == (3, "q")


def test_importing_records_does_not_import_dataclasses_or_inspect() -> None:
    code = (
        "import sys, hook.core.record, hook.core.plan, hook.core.oci; "
        "print(sorted({'dataclasses', 'inspect'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
