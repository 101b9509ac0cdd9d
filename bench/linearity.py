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

__all__ = ["calls", "check_effect_calls", "check_effect_times", "measure", "reference_times"]


def _decide_once(root: Path, bundle: Path, cache: Path, empty: Path, count: bool = False) -> float:
    """Seconds (or, with ``count``, Python calls) of gather + decide + the v1 effect check."""
    from hook.adapters.apply.cgroup_v1 import check_effect, parse_list
    from hook.core.decide import decide
    from hook.core.oci import parse_state
    from hook.core.settings import Settings
    from hook.routes.gather import Options, load_inputs

    state = parse_state(bundles.state_for(bundle, "odh-bench-linear", os.getpid()), "state")
    settings = Settings(cache_dir=str(cache), log_file=str(cache / "hook.log"))
    opts = Options(driver_root=root, spec_dirs=(empty,), settings=settings, use_cache=True)
    plans = []

    def run() -> None:
        plan = decide(load_inputs(state, opts))
        plans.append((plan, check_effect(parse_list("a *:* rwm\n", "devices.list"), plan.rules)))

    start = time.perf_counter()
    made = calls(run) if count else 0
    if not count:
        run()
    elapsed = time.perf_counter() - start
    plan, failed = plans[-1]
    if failed or not plan.rules:
        raise RuntimeError(f"linearity: unexpected plan for {root}: {len(plan.rules)} rules, failed {failed}")
    return float(made) if count else elapsed


def measure(
    small: tuple[Path, Any], large: tuple[Path, Any], tmp: Path, reps: int
) -> tuple[float, float, int, int]:
    """Best seconds, then Python calls, of the decision path for the slice pod on each host."""
    empty = tmp / "linear" / "no-cdi"
    empty.mkdir(parents=True, exist_ok=True)
    rootfs = bundles.build_rootfs(tmp / "rootfs")
    times, counts = [], []
    for n, (root, spec) in enumerate((small, large)):
        config = hosts.slice_config(bundles.slice_config(rootfs, "/unused"), spec)
        bundle = bundles.write_bundle(tmp / "linear" / f"bundle{n}", config)
        cache = tmp / "linear" / f"cache{n}"
        _decide_once(root, bundle, cache, empty)
        times.append(min(_decide_once(root, bundle, cache, empty) for _ in range(max(3, reps // 3))))
        counts.append(int(_decide_once(root, bundle, cache, empty, count=True)))
    return times[0], times[1], counts[0], counts[1]


def check_effect_times(n: int) -> float:
    """Best seconds of ``check_effect`` for ``2n`` rules (n allows, n denies) on an n-entry list."""
    from hook.adapters.apply.cgroup_v1 import ListEntry, check_effect
    from hook.core.rules import Access, DeviceType, Rule

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


def reference_times(n: int) -> float:
    """Best seconds of a plainly linear workload of the same shape as ``check_effect_times(n)``
    (tuple keys into dicts, 16n operations): on a small shared machine, memory effects alone make
    4x the data cost far more than 4x the time, so growth is judged against this."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        table: dict[tuple[str, int, int], int] = {}
        for bit in range(8):
            for minor in range(2 * n):
                key = ("c", 195, minor)
                table[key] = table.get(key, 0) | bit
        best = min(best, time.perf_counter() - start)
    return best


def calls(run: Any) -> int:
    """Python-level calls ``run()`` makes (cProfile's count): work, not time, so the machine's
    load and memory effects cannot blur a linear step into a quadratic one or back."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    run()
    profile.disable()
    return int(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]


def check_effect_calls(n: int) -> int:
    from hook.adapters.apply.cgroup_v1 import ListEntry, check_effect
    from hook.core.rules import Access, DeviceType, Rule

    rw = Access.R | Access.W
    entries = [ListEntry(DeviceType.CHAR, 195, m, rw) for m in range(n)]
    rules = [Rule(allow=True, type=DeviceType.CHAR, major=195, minor=m, access=rw) for m in range(n)]
    rules += [Rule(allow=False, type=DeviceType.CHAR, major=237, minor=m) for m in range(n)]
    return calls(lambda: check_effect(entries, rules))
