"""The node as the installer sees it: node paths inside ``--root``, whole-file writes, one-line errors.

Rule: every write the installer makes goes through here (``hook.tools.nodefs``), so a file on the node
is the old one or the new one, never a half; paths given as options are the node's paths (what the
engine reads), resolved inside the root as the node resolves them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from hook.core.errors import HookError
from hook.tools import engines, nodefs

PKG = "oci-device-hook"


DEFAULTS = {
    "libexec": "/usr/libexec/oci-device-hook",
    "hooks_dir": "/usr/share/containers/oci/hooks.d",
    "etc": "/etc/oci-device-hook",
    "state_dir": "/var/lib/oci-device-hook",
    "containerd_config": "/etc/containerd/config.toml",
    "containerd_state": "/run/containerd",
}


PLAIN_PATH = re.compile(r"(/[A-Za-z0-9_.+-]+)+")  # what the launchers and the wrapper name unquoted


OTHER_HOOKS_DIRS = ("/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d")


class InstallError(HookError):
    """The install or uninstall cannot go on; nothing (more) was changed."""


class Node:
    """The node's filesystem as the installer sees it: node paths mapped under ``root``."""

    def __init__(self, root: str, opts: argparse.Namespace) -> None:
        self.root = root
        self.opts = opts

    def path(self, node_path: str, *, follow: bool = True) -> Path:
        """``node_path`` resolved inside the root (``hook.tools.nodefs``): a symlink on the node means
        what it means to the node's engines, never a path in the installer's own filesystem."""
        try:
            return nodefs.resolve_in_root(self.root, node_path, follow=follow)
        except ValueError as exc:
            raise InstallError(node_path, "", str(exc).split(": ", 1)[-1]) from None
        except OSError as exc:
            raise InstallError(node_path, "", f"cannot resolve inside {self.root}: {exc.strerror}") from None

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        cmd = argv if self.root == "/" else ["chroot", self.root, *argv]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        except OSError as exc:
            return subprocess.CompletedProcess(cmd, 127, "", str(exc))


def say(text: str) -> None:
    sys.stderr.write(f"{PKG}: {text}\n")


def atomic_write(
    path: Path, data: bytes, mode: int = 0o644, verify: Callable[[bytes], None] | None = None
) -> None:
    """``hook.tools.nodefs.atomic_write``; a failure is one line saying the file was left as it was."""
    try:
        nodefs.atomic_write(path, data, mode, verify)
    except OSError as exc:
        raise InstallError(str(path), "", f"not written ({exc.strerror or exc}); left as it was") from None


def json_ok(data: bytes) -> None:
    json.loads(data)


def toml_ok(source: str) -> Callable[[bytes], None]:
    def check(data: bytes) -> None:
        engines.parse(data.decode(), f"{source} (as written)")

    return check


def atomic_symlink(target: str, link: Path) -> None:
    """Point ``link`` at ``target`` in one rename: a reader sees the old or the new link, never none."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def read_in_root(node: Node) -> tuple[Callable[[str], str | None], Callable[[str], list[str]]]:
    def read(path: str) -> str | None:
        try:
            return node.path(path).read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise InstallError(path, "", f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None

    def listdir(path: str) -> list[str]:
        try:
            return sorted(os.listdir(node.path(path)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    return read, listdir
