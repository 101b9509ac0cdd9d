"""CDI resolution at scale: synthetic spec dirs and in-process timing of ``Registry.load`` + ``resolve``.

Rule: a "shape" is (devices, files); the specs name every node with type/major/minor, so no host
node is needed. ``cold`` means no parsed-spec cache file (the load then parses every spec and
writes the cache, as the first container on a node does); ``cached`` means the cache from a
previous load is present and current. bench/main.py times the same shapes as whole hook processes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

KIND = "bench.example.com/gpu"
MAJOR = 240


def device_name(index: int) -> str:
    return f"dev{index}"


def write_specs(dest: Path, devices: int, files: int) -> Path:
    """``devices`` devices spread evenly over ``files`` spec files in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    per_file = -(-devices // files)
    for f in range(files):
        first, last = f * per_file, min(devices, (f + 1) * per_file)
        spec = {
            "cdiVersion": "0.5.0",
            "kind": KIND,
            "devices": [
                {
                    "name": device_name(i),
                    "containerEdits": {
                        "deviceNodes": [
                            {
                                "path": f"/dev/bench{i}",
                                "type": "c",
                                "major": MAJOR,
                                "minor": i,
                                "permissions": "rw",
                            }
                        ]
                    },
                }
                for i in range(first, last)
            ],
            "containerEdits": {"env": [f"BENCH_SPEC={f}"]},
        }
        (dest / f"bench-{f:02d}.json").write_text(json.dumps(spec, indent=1))
    return dest


def last_device(devices: int) -> str:
    """The qualified name of the device in the last file (the worst case for a scan)."""
    return f"{KIND}={device_name(devices - 1)}"


def time_inprocess(spec_dir: Path, cache_dir: Path, name: str, *, cold: bool, reps: int) -> list[float]:
    """Seconds per ``Registry.load(...).resolve([name])`` (imports already paid)."""
    from hook.sources.cdi.cache import CACHE_NAME
    from hook.sources.cdi.registry import Registry

    cache_file = cache_dir / CACHE_NAME
    Registry.load([spec_dir], cache_dir).resolve([name])  # warm imports and (for cached) the cache
    samples: list[float] = []
    for _ in range(reps):
        if cold:
            cache_file.unlink(missing_ok=True)
        start = time.perf_counter()
        Registry.load([spec_dir], cache_dir).resolve([name])
        samples.append(time.perf_counter() - start)
    return samples
