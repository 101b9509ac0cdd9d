"""Which config a runtime's command line creates a container from: only what all four readings agree on.

Rule: pure. ``creates`` reads the line with each grammar (``runc``: runc 1.1 and 1.2+; ``crun``:
crun up to 1.20 and 1.21+) and answers a config only when each reading accepts the line, creates
a container from it and names the same ``config.json``; otherwise ``ArgsError`` (refuse, write
nothing) or ``None`` (no reading creates: pass through).
"""


from __future__ import annotations

from hook.routes.runtimeargs.crun import read_crun, read_crun_1_8
from hook.routes.runtimeargs.runc import read_runc_1_1, read_runc_1_2
from hook.routes.runtimeargs.values import CREATES, ArgsError, Creates

TYPE_CHECKING = False  # collections.abc is not imported at run time: this is on every create's path
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    Reader = Callable[[Sequence[str]], Creates | None]

__all__ = [
    "ArgsError",
    "Creates",
    "CREATES",
    "READERS",
    "creates",
    "read_crun",
    "read_crun_1_8",
    "read_runc_1_1",
    "read_runc_1_2",
]

READERS: tuple[tuple[str, Reader], ...] = (
    ("runc 1.1", read_runc_1_1),
    ("runc 1.2", read_runc_1_2),
    ("crun 1.8", read_crun_1_8),
    ("crun", read_crun),
)


def creates(args: Sequence[str], is_dir: Callable[[str], bool] = lambda _: True) -> Creates | None:
    """The config file this command line creates a container from, or None when no reading creates
    one (pass it through: nothing is touched). ``ArgsError`` when no runtime would accept it, when
    a reading creates a container and another rejects the line or creates nothing, when they name
    different config files, or when crun would read another file than the bundle's ``config.json``.

    ``is_dir`` says whether a bundle directory exists: a reading whose bundle does not is one its
    runtime rejects (runc's chdir, crun's realpath fail), as ``-b=X`` is for crun (bundle ``=X``).
    The one returned says ``cgroup_manager="systemd"`` when any reading does (the wrapper cannot tell
    which runtime it fronts; the systemd driver is the reading that matters for crun's widening).
    """
    accepted: list[tuple[str, Creates | None]] = []
    errors: list[str] = []
    for name, reader in READERS:
        try:
            found = reader(args)
            if found is not None and not is_dir(found.bundle or "."):
                raise ArgsError(f"no bundle directory {found.bundle!r}")
            accepted.append((name, found))
        except ArgsError as exc:
            errors.append(f"{name}: {exc}")
    if not accepted:
        raise ArgsError("no runtime accepts it: " + "; ".join(errors))
    creating = [c for _, c in accepted if c is not None]
    if not creating:
        return None
    if errors:
        raise ArgsError(f"not every runtime would create a container from it ({'; '.join(errors)})")
    if len(creating) != len(accepted):
        names = ", ".join(n for n, c in accepted if c is None)
        raise ArgsError(f"{names} would not create a container from it, the others would")
    paths = {c.config_path for c in creating}
    if len(paths) != 1:
        raise ArgsError(f"runtimes would read different configs: {', '.join(sorted(paths))}")
    first = creating[0]
    if first.config != "config.json":
        raise ArgsError(f"crun --config {first.config}: the wrapper decides only the bundle's config.json")
    if any(c.cgroup_manager == "systemd" for c in creating):
        from hook.core.record import replace

        return replace(first, cgroup_manager="systemd")
    return first
