"""In-process timing of the decision path at two host sizes, to show every step is linear.

Rule: imports and first-use costs are paid before timing; each size reports the best of its
repetitions (the least disturbed by other load), so the ratio between sizes is the algorithm's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench import bundles, hosts

__all__ = ["check_effect_times", "measure"]


def _decide_once(root: Path, bundle: Path, cache: Path, empty: Path) -> float:
    from hook.apply.cgroup_v1 import check_effect, parse_list
    from hook.decide import decide
    from hook.gather import Options, load_inputs
    from hook.oci import parse_state
    from hook.settings import Settings

    state = parse_state(bundles.state_for(bundle, "odh-bench-linear", os.getpid()), "state")
    settings = Settings(cache_dir=str(cache), log_file=str(cache / "hook.log"))
    opts = Options(driver_root=root, spec_dirs=(empty,), settings=settings, use_cache=True)
    start = time.perf_counter()
    plan = decide(load_inputs(state, opts))
    failed = check_effect(parse_list("a *:* rwm\n", "devices.list"), plan.rules)
    elapsed = time.perf_counter() - start
    if failed or not plan.rules:
        raise RuntimeError(f"linearity: unexpected plan for {root}: {len(plan.rules)} rules, failed {failed}")
    return elapsed


def measure(small: tuple[Path, Any], large: tuple[Path, Any], tmp: Path, reps: int) -> tuple[float, float]:
    """Best seconds of gather + decide + the v1 effect check for the slice pod on each host."""
    empty = tmp / "linear" / "no-cdi"
    empty.mkdir(parents=True, exist_ok=True)
    rootfs = bundles.build_rootfs(tmp / "rootfs")
    out = []
    for n, (root, spec) in enumerate((small, large)):
        config = hosts.slice_config(bundles.slice_config(rootfs, "/unused"), spec)
        bundle = bundles.write_bundle(tmp / "linear" / f"bundle{n}", config)
        cache = tmp / "linear" / f"cache{n}"
        _decide_once(root, bundle, cache, empty)
        out.append(min(_decide_once(root, bundle, cache, empty) for _ in range(max(3, reps // 3))))
    return out[0], out[1]


def check_effect_times(n: int) -> float:
    """Best seconds of ``check_effect`` for ``2n`` rules (n allows, n denies) on an n-entry list."""
    from hook.apply.cgroup_v1 import ListEntry, check_effect
    from hook.rules import Access, DeviceType, Rule

    rw = Access.R | Access.W
    entries = [ListEntry(DeviceType.CHAR, 195, m, rw) for m in range(n)]
    rules = [Rule(allow=True, type=DeviceType.CHAR, major=195, minor=m, access=rw) for m in range(n)]
    rules += [Rule(allow=False, type=DeviceType.CHAR, major=237, minor=m) for m in range(n)]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        check_effect(entries, rules)
        best = min(best, time.perf_counter() - start)
    return best
