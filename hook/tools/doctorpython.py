"""``hook doctor``'s interpreter line: which Python, OpenSSL and glibc the hook runs on, and who
patches them.

Rule: the bundled interpreter (the .deb's and the image's ``python/``) carries its own copies of
CPython, glibc and OpenSSL's libraries, which the node's package updates never reach: the operator
patches them by rebuilding (docs/release.md). Its versions are read from the bundle itself
(``python/BUNDLE.json``, written by packaging/bundle-python when it was built); a bundle without
one is from before they were recorded and is a warning. On the node's own Python (a
``--python`` install, a package built with ``INTERPRETER=system``, a checkout) the node's package
manager patches them: the line says so.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from hook.tools.checks import Check

__all__ = ["check_interpreter", "REBUILD"]

NAME = "interpreter"
REBUILD = "packaging/release OUT_DIR"  # the one command that rebuilds it (docs/release.md)
MAX_BYTES = 64 << 10


def _openssl() -> str:
    try:
        import ssl
    except ImportError:
        return "OpenSSL (version unknown)"
    return ssl.OPENSSL_VERSION


def _bundle(prefix: Path) -> dict[str, object] | None:
    """BUNDLE.json of the interpreter at ``prefix``; None when it is not a bundle that has one."""
    try:
        with open(prefix / "BUNDLE.json", "rb") as f:
            data = json.loads(f.read(MAX_BYTES))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_bundle(prefix: Path) -> bool:
    lib = prefix / "lib"
    return any(lib.glob("ld-linux*.so*")) or any(
        lib.glob("ld64.so*")
    )  # its own loader: packaging/bundle-python


def check_interpreter(prefix: Path | None = None) -> Check:
    """The line for the interpreter at ``prefix`` (default: the one running, ``sys.prefix``)."""
    prefix = Path(sys.prefix) if prefix is None else prefix
    info = _bundle(prefix)
    if info is not None:
        packages = info.get("packages")
        source = ""
        if isinstance(packages, dict) and packages:
            source = "; from " + ", ".join(
                f"{k} {v}" for k, v in sorted(packages.items()) if isinstance(v, str)
            )
        detail = (
            f"bundled Python {info.get('python', '?')}, {info.get('openssl') or 'OpenSSL ?'}, "
            f"{info.get('glibc') or 'glibc ?'}, built {info.get('built', '?')} ({prefix}){source}. "
            f"Not patched by the node's updates: you patch them by rebuilding ({REBUILD}) and upgrading"
        )
        return Check(NAME, True, detail)
    here = (
        f"Python {platform.python_version()}, {_openssl()}, {os.confstr('CS_GNU_LIBC_VERSION') or 'libc ?'}"
    )
    if _is_bundle(prefix):
        return Check(
            NAME,
            True,
            f"bundled {here} ({prefix}), built before its versions were recorded (no BUNDLE.json)",
            f"rebuild ({REBUILD}) and upgrade: you patch the bundled interpreter, not the node",
            warn=True,
        )
    return Check(NAME, True, f"the node's {here} ({sys.executable}): patched by the node's package manager")
