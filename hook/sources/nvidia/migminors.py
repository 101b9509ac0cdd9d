"""``/proc/driver/nvidia-caps/mig-minors``: which cap minor each MIG capability would use.

Rule: the file lists every *possible* capability (32 GPUs), so a capability counts only when its
capability file or its ``/dev/nvidia-caps`` node exists. ``gpuG`` is the GPU device minor. An
unknown line is skipped with a warning that is returned, never printed. Pure: no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from hook.core.errors import InputError
from hook.core.record import field, record
from hook.sources.nvidia.model import CapNode, CapTable

TYPE_CHECKING = False  # typing is not imported at run time (start-up cost)
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "MIG_MINORS_PATH",
    "MigMinors",
    "build_cap_table",
    "cap_key",
    "ci_cap_name",
    "dev_cap_path",
    "gi_cap_name",
    "parse_mig_minors",
    "proc_cap_path",
]

MIG_MINORS_PATH: Final = "proc/driver/nvidia-caps/mig-minors"
CAPS_PROC_DIR: Final = "proc/driver/nvidia/capabilities"
CAPS_DEV_DIR: Final = "dev/nvidia-caps"

_GLOBAL: Final = ("config", "monitor")
_VALID_LINE_RE: Final = r"^[ \t]*(config|monitor|gpu\d+/gi\d+(?:/ci\d+)?/access)[ \t]+(\d+)[ \t]*$"
_compiled: list[re.Pattern[str]] = []


def _valid_line() -> re.Pattern[str]:
    """Compiled on first use: with the table cached (hook.sources.nvidia.inventory) most starts never
    parse it."""
    if not _compiled:
        _compiled.append(re.compile(_VALID_LINE_RE, re.MULTILINE))
    return _compiled[0]


@record
class MigMinors:
    """Every listed capability name (``config``, ``gpu0/gi1/access``, ...) → its minor."""

    by_name: Mapping[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def config(self) -> int | None:
        return self.by_name.get("config")

    @property
    def monitor(self) -> int | None:
        return self.by_name.get("monitor")

    @property
    def gi(self) -> dict[tuple[int, int], int]:
        keys = ((cap_key(name), minor) for name, minor in self.by_name.items())
        return {(k[0], k[1]): minor for k, minor in keys if len(k) == 2}

    @property
    def ci(self) -> dict[tuple[int, int, int], int]:
        keys = ((cap_key(name), minor) for name, minor in self.by_name.items())
        return {(k[0], k[1], k[2]): minor for k, minor in keys if len(k) == 3}

    def names(self) -> Mapping[str, int]:
        return self.by_name


def _number(part: str, prefix: str) -> int | None:
    """``gpu12`` with prefix ``gpu`` → 12 (``\\d+``: any Unicode decimal digits), else None."""
    digits = part[len(prefix) :]
    return int(digits) if part.startswith(prefix) and digits.isdecimal() else None


def cap_key(name: str) -> tuple[int, ...]:
    """``gpu0/gi1/access`` → (0, 1); ``gpu0/gi1/ci2/access`` → (0, 1, 2); else ().

    String methods equal to ``gpu(\\d+)/gi(\\d+)(/ci(\\d+))?/access`` (tests/nvidia/test_ids_parsers.py),
    called for every capability on every start; a pattern cost a compile each start.
    """
    parts = name.split("/")
    if len(parts) not in (3, 4) or parts[-1] != "access":
        return ()
    nums = [_number(p, pre) for p, pre in zip(parts[:-1], ("gpu", "gi", "ci"), strict=False)]
    return () if None in nums else tuple(n for n in nums if n is not None)


def gi_cap_name(gpu_minor: int, gi: int) -> str:
    return f"gpu{gpu_minor}/gi{gi}/access"


def ci_cap_name(gpu_minor: int, gi: int, ci: int) -> str:
    return f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"


def proc_cap_path(name: str) -> str:
    """Driver-root-relative capability file: ``gpu0/gi1/access`` → ``…/gpu0/mig/gi1/access``."""
    if name in _GLOBAL:
        return f"{CAPS_PROC_DIR}/mig/{name}"
    gpu, _, rest = name.partition("/")
    return f"{CAPS_PROC_DIR}/{gpu}/mig/{rest}"


def dev_cap_path(minor: int) -> str:
    return f"{CAPS_DEV_DIR}/nvidia-cap{minor}"


def _slow_parse(text: str, source: str) -> tuple[list[tuple[str, str, int]], list[str]]:
    """Line by line, for files with junk: (name, minor, line number) plus one warning per bad line."""
    pairs: list[tuple[str, str, int]] = []
    warnings: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        match = _valid_line().fullmatch(line)
        if match is None:
            warnings.append(f"{source}: line {lineno}: skipped unexpected line {line!r}")
        else:
            pairs.append((match[1], match[2], lineno))
    return pairs, warnings


def parse_mig_minors(text: str, source: str = MIG_MINORS_PATH) -> MigMinors:
    """Parse the file's ``<name> <minor>`` lines; a duplicate name is an error, junk a warning.

    The driver lists ~4300 lines, so valid files take one C-level ``findall``; only a file with
    some other line is walked line by line to name it.
    """
    fast = _valid_line().findall(text)
    if len(fast) == text.count("\n") + (not text.endswith("\n")):  # every line valid (no blank ones)
        pairs, warnings = [(name, minor, 0) for name, minor in fast], list[str]()
    else:
        pairs, warnings = _slow_parse(text, source)
    by_name = dict(zip([p[0] for p in pairs], map(int, [p[1] for p in pairs]), strict=True))
    if len(by_name) != len(pairs):
        seen: set[str] = set()
        for name, _minor, lineno in pairs if warnings else _slow_parse(text, source)[0]:
            if name in seen:
                raise InputError(source, f"line {lineno}", f"capability {name!r} is listed twice")
            seen.add(name)
    return MigMinors(by_name=by_name, warnings=tuple(warnings))


_inverse: list[tuple[MigMinors, dict[int, str]]] = []  # the last table's minor -> name


def _by_minor(minors: MigMinors) -> dict[int, str]:
    """minor -> name of ``minors`` (the last name for a minor listed twice, as the inversion by
    dict display always gave); the last table's is kept, so a resident decider inverts its
    (kept) table once, not per decision."""
    held = _inverse[0] if _inverse else None
    if held is not None and held[0] is minors:
        return held[1]
    inverse = {minor: name for name, minor in minors.by_name.items()}
    _inverse[:] = [(minors, inverse)]
    return inverse


def build_cap_table(
    minors: MigMinors, proc_caps: Mapping[str, CapNode], dev_caps: Mapping[int, CapNode]
) -> tuple[CapTable, tuple[str, ...]]:
    """Keep the listed capabilities that exist.

    ``proc_caps`` maps a capability name to the node its capability file describes;
    ``dev_caps`` maps a minor to the node found under ``/dev/nvidia-caps``. The capability file
    wins (it carries the driver's mode); a minor that disagrees with mig-minors is a warning.
    """
    warnings: list[str] = []
    found: dict[str, CapNode] = {}
    for name, node in proc_caps.items():
        minor = minors.by_name.get(name)
        if minor is None:
            continue
        if node.minor != minor:
            warnings.append(
                f"{proc_cap_path(name)}: DeviceFileMinor {node.minor} differs from mig-minors ({minor}); "
                "using the capability file"
            )
        found[name] = node
    if dev_caps:
        by_minor = _by_minor(minors)
        for minor, node in dev_caps.items():
            listed = by_minor.get(minor)
            if listed is not None and listed not in found:
                found[listed] = node
    keyed = {cap_key(name): node for name, node in found.items()}
    table = CapTable(
        config=found.get("config"),
        monitor=found.get("monitor"),
        gi={(k[0], k[1]): node for k, node in keyed.items() if len(k) == 2},
        ci={(k[0], k[1], k[2]): node for k, node in keyed.items() if len(k) == 3},
    )
    return table, tuple(warnings)
