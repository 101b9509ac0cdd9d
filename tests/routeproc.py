"""Run one per-start hook process as the launcher does and record what it imported:
``routeproc.py LIB OUT -- ARGS`` (``ARGS`` as ``hook.entry.main`` takes them, ``runtime-wrapper ...``
included).

Rule: as ``bench/hookproc.py`` (``python3 -ISB``, ``LIB`` first on ``sys.path``, the state or config
on fd 0), except that an ``exec`` of the real runtime (the wrapper's last step) is where the record
is written and the process ends, so the wrapper route is measured too. One JSON line goes to
``OUT``: the route's exit status (``"exec"`` for a wrapper that would start the runtime), the
modules loaded after the interpreter's own start, the process's forks (an audit hook's count of
``os.fork``: each costs a start 2-3 ms) and whether the cycle collector was still on at the end.
"""

import os  # no from __future__: the routes' own loading of it is measured
import posix
import sys


def main(argv: list[str]) -> int:
    lib, out, rest = argv[0], argv[1], argv[2:]
    if rest[:1] != ["--"]:
        sys.stderr.write("usage: routeproc.py LIB OUT -- ARGS\n")
        return 2
    sys.path.insert(0, lib)
    before = set(sys.modules)
    forks = [0]

    def audit(event: str, args: object) -> None:
        if event == "os.fork":
            forks[0] += 1

    sys.addaudithook(audit)

    def record(rc: object) -> None:
        loaded = sorted(set(sys.modules) - before)
        import gc  # only now, as json
        import json  # only now: the measured run must not find it loaded

        with open(out, "a") as f:
            f.write(json.dumps({"rc": rc, "loaded": loaded, "forks": forks[0], "gc": gc.isenabled()}) + "\n")

    def execvp(path: str, args: list[str]) -> None:
        record("exec")
        os._exit(0)

    os.execvp = execvp  # type: ignore[assignment]
    posix.execve = lambda path, args, env: execvp(path, args)  # type: ignore[assignment]  # the wrapper
    from hook.entry import main as hook_main

    rc = hook_main(rest[1:])
    record(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
