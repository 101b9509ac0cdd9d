"""Frozen, slotted value records: what ``@dataclass(frozen=True, slots=True, kw_only=True)`` gives,
without its cost on every container start.

Rule: a record is built by reading the class's annotations once and installing shared, generic
methods. ``dataclasses`` generates and ``exec``s new source for every class (about 1.3 ms each
on a small node, 30+ classes on a device container's path) and imports ``inspect``, ``ast`` and
``dis`` on the way; this module imports nothing (``typing`` only for the type checker).

Supported, because the hook uses it: keyword-only (default) or positional fields, defaults,
``field(default=, default_factory=, compare=, repr=)``, ``__post_init__``, equality and hashing
over compared fields, ``replace``, ``fields`` and ``asdict``. Annotations stay strings (every
module has ``from __future__ import annotations``): a record never evaluates them.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost); mypy sees the real ones
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform, overload

    T = TypeVar("T")
    A = TypeVar("A")
    R = TypeVar("R")
else:

    def dataclass_transform(**_kwargs):
        return lambda f: f


__all__ = ["FrozenInstanceError", "Field", "asdict", "field", "fields", "last", "record", "replace"]

_MISSING: Any = object()


class FrozenInstanceError(AttributeError):
    """Assigning to a record's field after construction."""


class Field:
    __slots__ = ("compare", "default", "default_factory", "name", "repr")

    def __init__(self, default: Any, default_factory: Any, compare: bool, repr: bool) -> None:
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.compare = compare
        self.repr = repr


def field(
    *, default: Any = _MISSING, default_factory: Any = _MISSING, compare: bool = True, repr: bool = True
) -> Any:
    return Field(default, default_factory, compare, repr)


def _own_fields(cls: type) -> tuple[Field, ...]:
    out = []
    # inspect.get_annotations would import inspect, the cost this module exists to avoid
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
        if "ClassVar" in str(annotation):
            continue
        value = cls.__dict__.get(name, _MISSING)
        spec = value if isinstance(value, Field) else Field(value, _MISSING, True, True)
        spec.name = name
        out.append(spec)
    return tuple(out)


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    specs: tuple[Field, ...] = type(self).__record_fields__
    if args:
        if type(self).__record_kw_only__:
            raise TypeError(f"{type(self).__name__}() takes keyword arguments only")
        if len(args) > len(specs):
            raise TypeError(f"{type(self).__name__}() takes at most {len(specs)} positional arguments")
        for spec, value in zip(specs, args, strict=False):
            if spec.name in kwargs:
                raise TypeError(f"{type(self).__name__}() got multiple values for {spec.name!r}")
            kwargs[spec.name] = value
    for spec in specs:
        value = kwargs.pop(spec.name, _MISSING)
        if value is _MISSING:
            if spec.default is not _MISSING:
                value = spec.default
            elif spec.default_factory is not _MISSING:
                value = spec.default_factory()
            else:
                raise TypeError(f"{type(self).__name__}() missing required argument {spec.name!r}")
        object.__setattr__(self, spec.name, value)
    if kwargs:
        raise TypeError(f"{type(self).__name__}() got unexpected arguments {sorted(kwargs)}")
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


def _compared(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, s.name) for s in type(self).__record_fields__ if s.compare)


def _eq(self: Any, other: object) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _compared(self) == _compared(other)


def _hash(self: Any) -> int:
    return hash(_compared(self))


def _repr(self: Any) -> str:
    shown = (f"{s.name}={getattr(self, s.name)!r}" for s in type(self).__record_fields__ if s.repr)
    return f"{type(self).__qualname__}({', '.join(shown)})"


def _setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _build(cls: type, kw_only: bool) -> type:
    specs = _own_fields(cls)
    body = {k: v for k, v in cls.__dict__.items() if k not in {s.name for s in specs}}
    body.pop("__dict__", None)
    body.pop("__weakref__", None)
    body.update(
        __slots__=tuple(s.name for s in specs),
        __record_fields__=specs,
        __record_kw_only__=kw_only,
        __match_args__=tuple(s.name for s in specs),
        __init__=_init,
        __eq__=_eq,
        __hash__=_hash,
        __repr__=_repr,
        __setattr__=_setattr,
        __delattr__=_delattr,
    )
    new = type(cls)(cls.__name__, cls.__bases__, body)
    new.__qualname__ = cls.__qualname__
    return new


if TYPE_CHECKING:  # the overloads exist for the type checker only

    @overload
    def record(cls: type[T], /) -> type[T]: ...
    @overload
    def record(*, kw_only: bool = True) -> Any: ...


@dataclass_transform(
    kw_only_default=True, frozen_default=True, eq_default=True, field_specifiers=(field, Field)
)
def record(cls: Any = None, /, *, kw_only: bool = True) -> Any:
    """Turn an annotated class into a frozen, slotted, keyword-only (by default) value class."""
    if cls is None:
        return lambda c: _build(c, kw_only)
    return _build(cls, kw_only)


def fields(obj: Any) -> tuple[Field, ...]:
    cls = obj if isinstance(obj, type) else type(obj)
    specs: tuple[Field, ...] = getattr(cls, "__record_fields__")  # noqa: B009 - set by _build
    return specs


def replace(obj: T, /, **changes: Any) -> T:
    values = {s.name: getattr(obj, s.name) for s in fields(obj)}
    unknown = set(changes) - set(values)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no fields {sorted(unknown)}")
    values.update(changes)
    return type(obj)(**values)


def asdict(obj: Any) -> Any:
    """Fields to a dict, records nested in tuples and lists included (as ``dataclasses.asdict``)."""
    if hasattr(type(obj), "__record_fields__"):
        return {s.name: asdict(getattr(obj, s.name)) for s in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return type(obj)(asdict(v) for v in obj)
    if isinstance(obj, dict):
        return {k: asdict(v) for k, v in obj.items()}
    return obj


def last(fn: Callable[[A], R]) -> Callable[[A], R]:
    """``fn``, remembering its last argument and result: one decision asks some things of the same
    container more than once (decide, its narrowing, the report), and on a big node the answer is a
    record per device. The argument is a frozen value, compared by identity and held with the
    result, so its id never passes to another while remembered; one slot, so memory stays one
    result; the decider's threads may compute a value twice, never see another's. (Here, not in a
    module of its own: the in-process path loads this one already.)"""
    box: list[tuple[A, R]] = []

    def call(arg: A) -> R:
        held = box[-1] if box else None
        if held is not None and held[0] is arg:
            return held[1]
        result = fn(arg)
        box[:] = [(arg, result)]
        return result

    return call
