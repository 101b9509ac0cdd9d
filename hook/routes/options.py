"""Where a decision reads the host: the live and spec-level options, made concrete by the settings.

Rule: a command-line option wins over the settings file, which wins over the default; an option
that names a file that is not there is an error, never "nothing there".
"""

from __future__ import annotations

from pathlib import Path

from hook.core.errors import InputError
from hook.core.record import field, record, replace
from hook.core.settings import Settings

__all__ = ["Options", "inventory_option", "options_from", "resolved"]


@record
class Options:
    """Where a decision reads the host. ``None``/``()`` mean "the settings' ``driver_root`` /
    ``cdi_spec_dirs``": a command-line option wins over the settings file, which wins over the default."""

    driver_root: Path | None = None
    spec_dirs: tuple[Path, ...] = ()
    inventory_file: Path | None = None
    settings_file: Path | None = None
    use_cache: bool = True  # simulation never writes caches
    dra_state: Path | None = None  # simulation's --kubelet-dra-state: wins over kubelet_dra_state
    checkpoint: Path | None = None  # simulation's --kubelet-checkpoint: wins over kubelet_checkpoint
    settings: Settings | None = field(default=None, compare=False)


def inventory_option(path: Path | None) -> Path | None:
    """``--inventory`` as given: a file that is not there is an error, never "no inventory" (a
    missing one would otherwise pass for a driver on a CPU node, or go unread without a word)."""
    if path is not None and not path.is_file():
        why = "not a regular file" if path.exists() else "no such file"
        raise InputError(str(path), "", f"{why} (--inventory)")
    return path



def resolved(opts: Options, settings: Settings) -> Options:
    """``opts`` with the driver root and spec dirs made concrete (options, else settings)."""
    return replace(
        opts,
        driver_root=opts.driver_root if opts.driver_root is not None else Path(settings.driver_root),
        spec_dirs=opts.spec_dirs or tuple(Path(d) for d in settings.cdi_spec_dirs),
    )



def options_from(opts: dict[str, list[str]], *, use_cache: bool) -> Options:
    """Live and precreate argv as Options; what is not given comes from the settings (``resolved``)."""
    inventory = opts.get("--inventory")
    config = opts.get("--config")
    root = opts.get("--driver-root")
    return Options(
        driver_root=Path(root[-1]) if root else None,
        spec_dirs=tuple(Path(p) for p in opts.get("--cdi-spec-dir", ())),
        inventory_file=inventory_option(Path(inventory[-1]) if inventory else None),
        settings_file=Path(config[-1]) if config else None,
        use_cache=use_cache,
    )
