"""Bench rows for spec-level mode: ``runc run`` through the runtime wrapper vs bare runc.

Rule: the same containers and the same paired timing as rows (1) and (2) of ``bench.main``; only
the command differs: ``<libexec>/runtime --root R run --bundle B ID`` (packaging/runtime beside the
bench's launcher, as the package installs them), whose settings (``OCI_DEVICE_HOOK_CONFIG``, the
engine's environment) name runc as the real runtime. The wrapper runs ``hook precreate`` on the
bundle's config.json before runc: the no-device container passes through unchanged, the slice pod
is narrowed in the config (allow-list, no prestart hook at all).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import bundles
from bench.rows import Row
from bench.timing import Sample, paired

__all__ = ["wrapper_rows"]


def _sample(
    b: Any, name: str, make: Callable[[Path, str], dict[str, Any]], cmd0: str, env: dict[str, str], runc: str
) -> Sample:
    bundle = b.tmp / "bundles" / name
    state_root = b.tmp / "runc"

    def run() -> float:
        cid = f"odh-bench-{uuid.uuid4().hex[:10]}"
        bundles.write_bundle(bundle, make(b.rootfs, f"/odh-bench/{cid}"))
        cmd = [cmd0, "--root", str(state_root), "run", "--bundle", str(bundle), cid]
        start = time.perf_counter()
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, env=env)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            subprocess.run([runc, "--root", str(state_root), "delete", "-f", cid], capture_output=True)
            why = proc.stderr.decode(errors="replace").strip()
            raise RuntimeError(f"{name}: exit {proc.returncode}: {why}")
        return elapsed

    return run


def wrapper_rows(b: Any, runc: str) -> list[Row]:
    """Rows (7a) and (7b); ``b`` is ``bench.main.Bench`` (its launcher, rootfs, driver root, settings)."""
    wrapper = b.launcher.parent / "runtime"
    shutil.copy2(bundles.REPO / "packaging" / "runtime", wrapper)
    settings = b.tmp / "wrapper-settings.yaml"
    settings.write_text(b.settings.read_text() + f"runtime: {runc}\ndriver_root: {b.driver_root}\n")
    path = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    env = {"PATH": path, "OCI_DEVICE_HOOK_CONFIG": str(settings)}
    rows = []
    for label, make, target in (
        ("(7a) `runc run` through the runtime wrapper, no-device busybox container",
         bundles.nodev_config, None),
        ("(7b) `runc run` through the runtime wrapper, seed 000 slice pod (narrowed in config.json)",
         bundles.slice_config, None),
    ):  # fmt: skip
        key = "nodev" if make is bundles.nodev_config else "slice"
        bare = _sample(b, f"{key}-bare-w", make, runc, env, runc)
        wrapped = _sample(b, f"{key}-wrapper", make, str(wrapper), env, runc)
        rows.append(Row(label, "bare runc", paired(bare, wrapped, b.reps), target))
    return rows
