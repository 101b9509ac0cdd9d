"""What a runtime's reading of a command line yields, and how a reading refuses it.

Rule: plain values shared by the grammars (``runc``, ``crun``) and ``creates``; no parsing here.
"""

from __future__ import annotations

from hook.core.record import record

__all__ = ["ArgsError", "Creates", "CREATES"]

CREATES = frozenset({"create", "run", "restore"})  # the commands that build a container from a bundle


class ArgsError(ValueError):
    """The command line is one the runtime would reject, or one the wrapper cannot read for sure."""


@record
class Creates:
    """What one reading says a create-like command line does: the config file it reads."""

    command: str
    bundle: str  # "" = the working directory
    config: str = "config.json"  # relative to the bundle (crun's -f may name another file)
    ident: str = ""
    log: str = ""
    log_format: str = ""
    cgroup_manager: str = "cgroupfs"  # systemd | cgroupfs | disabled (crun), as the flags say

    @property
    def config_path(self) -> str:
        return f"{self.bundle or '.'}/{self.config}"
