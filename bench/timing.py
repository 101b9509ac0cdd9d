"""Paired, alternating timing: A and B run back to back, the order flipping every repetition.

Rule: on a shared 2-core machine the load drifts; pairing puts both sides of a ratio under the same
drift, and alternating the order cancels any first-runs-slower bias. Warm-up repetitions are run
and discarded. Reported values are medians; the ratio is median(B) / median(A).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

Sample = Callable[[], float]  # runs once, returns seconds


@dataclass(frozen=True, slots=True)
class Pair:
    a: tuple[float, ...]
    b: tuple[float, ...]

    @property
    def a_ms(self) -> float:
        return statistics.median(self.a) * 1000

    @property
    def b_ms(self) -> float:
        return statistics.median(self.b) * 1000

    @property
    def ratio(self) -> float:
        return self.b_ms / self.a_ms


def paired(a: Sample, b: Sample, reps: int, warmup: int = 2) -> Pair:
    for _ in range(warmup):
        a()
        b()
    xs: list[float] = []
    ys: list[float] = []
    for i in range(reps):
        if i % 2 == 0:
            xs.append(a())
            ys.append(b())
        else:
            ys.append(b())
            xs.append(a())
    return Pair(tuple(xs), tuple(ys))


def timed_process(cmd: Sequence[str], stdin: bytes | Path | None = None, what: str = "") -> Sample:
    """A sample that runs ``cmd`` (stdin from bytes or a file), fails loudly on a non-zero exit."""

    def run() -> float:
        if isinstance(stdin, Path):
            with open(stdin, "rb") as f:
                start = time.perf_counter()
                proc = subprocess.run(cmd, stdin=f, capture_output=True)
        else:
            start = time.perf_counter()
            proc = subprocess.run(cmd, input=stdin or b"", capture_output=True)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()
            raise RuntimeError(f"{what or cmd[0]}: exit {proc.returncode}: {err}")
        return elapsed

    return run


def median_ms(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1000


def round_robin(samples: dict[str, Sample], rounds: int, warmup: int = 2,
                before: Callable[[str], None] | None = None,
                after: Callable[[str], None] | None = None) -> dict[str, tuple[float, ...]]:
    """Every sample once per round, the order rotating by one each round (and reversed every other):
    all variants of a workload see the same drift, and none always runs first or after the same one.
    ``before``/``after`` run untimed around each sample (the decider's state, a served check)."""
    keys = list(samples)
    times: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(warmup + rounds):
        shift = r % len(keys)
        order = keys[shift:] + keys[:shift]
        if r % 2:
            order.reverse()
        for key in order:
            if before is not None:
                before(key)
            took = samples[key]()
            if after is not None:
                after(key)
            if r >= warmup:
                times[key].append(took)
    return {k: tuple(v) for k, v in times.items()}
