"""NVIDIA's runtime (``nvidia-container-runtime``) in CDI mode, for a row beside ours.

Rule: it is configured the way a CDI-mode install would be, but only through its own public
switches: a ``config.toml`` in the bench's scratch dir named by ``NVIDIA_CTK_CONFIG_FILE_PATH``
(the file path override the runtime reads), ``mode = "cdi"``, the same CDI spec dir our hook
resolves from, runc as its low-level runtime, its log to ``/dev/null`` (its default). It edits
``config.json`` on ``create`` (the CDI device's nodes and allow rules, which runc then applies)
and hands every other command straight to runc. The binary is not built by the bench:
docs/performance.md says how it was built; ``bench/run --nvidia-runtime PATH`` names it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["CONFIG_ENV", "write_config", "version"]

CONFIG_ENV = "NVIDIA_CTK_CONFIG_FILE_PATH"


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join('"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"' for s in items) + "]"


def write_config(dest: Path, spec_dirs: list[Path], runc: str) -> Path:
    """``dest``: the runtime's config.toml for CDI mode over ``spec_dirs``, execing ``runc``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(
        "[nvidia-container-runtime]\n"
        'debug = "/dev/null"\n'
        'log-level = "info"\n'
        'mode = "cdi"\n'
        f"runtimes = {_toml_list([runc])}\n"
        "\n[nvidia-container-runtime.modes.cdi]\n"
        f"spec-dirs = {_toml_list([str(d) for d in spec_dirs])}\n"
        'default-kind = "nvidia.com/gpu"\n'
        'annotation-prefixes = ["cdi.k8s.io/"]\n'
    )
    return dest


def version(binary: str) -> str:
    """Its first ``--version`` line (the commit/tag it was built from is in docs/performance.md)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "(unavailable)"
    return out.splitlines()[0] if out else "(no output)"
