"""Run the live hook in-process and report what it imported: ``hookproc.py LIB OUT [--stub-apply] -- ARGS``.

Rule: runs under the launcher's flags (``python3 -ISB``) with ``LIB`` first on ``sys.path``, calls
``hook.entry.main(ARGS)`` exactly as the launcher does (the OCI state on fd 0), then appends one JSON
line to ``OUT``: exit status, whether ``pynvml`` was ever imported, how many modules were loaded and
which ``hook`` modules. ``--stub-apply`` swaps ``hook.adapters.apply.transaction.apply_plan`` (and the
pid check ``hook.adapters.apply.locate.find_container``) for no-ops so
the whole decision path runs without a container (CDI timing and checks); without it the Plan is
applied for real (as a runc prestart hook).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    lib, out = argv[0], argv[1]
    rest = argv[2:]
    stub = rest[:1] == ["--stub-apply"]
    if stub:
        rest = rest[1:]
    if rest[:1] != ["--"]:
        sys.stderr.write("usage: hookproc.py LIB OUT [--stub-apply] -- ARGS\n")
        return 2
    sys.path.insert(0, lib)
    before = set(sys.modules)
    if stub:
        from hook.adapters.apply import transaction

        def apply_plan(plan: object, pid: int, **_kw: object) -> object:
            return transaction.AppliedInfo(cgroup_version=0)

        transaction.apply_plan = apply_plan  # type: ignore[assignment]
        from hook.adapters.apply import locate

        locate.find_container = lambda *_a, **_kw: None  # type: ignore[assignment]
    from hook.entry import main as hook_main

    rc = hook_main(rest[1:])
    loaded = sorted(set(sys.modules) - before)
    record = {
        "rc": rc,
        "pynvml": any(m == "pynvml" or m.startswith("pynvml.") for m in sys.modules),
        "modules": len(sys.modules),
        "new_modules": len(loaded),
        "hook_modules": [m for m in loaded if m == "hook" or m.startswith("hook.")],
        "heavy_stdlib": [m for m in ("json", "re", "enum", "dataclasses", "pathlib") if m in loaded],
        "loaded": loaded,
    }
    import json  # only now: the measured run must not find it preloaded

    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
