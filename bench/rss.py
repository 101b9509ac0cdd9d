"""Peak-RSS wrapper: ``rss.py OUT -- CMD...`` runs CMD as its only child, then writes the child's peak RSS.

Rule: stdlib only, run with ``python3 -I``; stdin/stdout/stderr pass straight through (as a hook,
the OCI state arrives on stdin) and the wrapper exits with the child's status. OUT receives the
``RUSAGE_CHILDREN`` ``ru_maxrss`` in KiB: with exactly one waited-for child that is the child's
own peak, with none of this wrapper's memory in it.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: rss.py OUT -- CMD...\n")
        return 2
    out, cmd = argv[0], argv[2:]
    rc = subprocess.call(cmd)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(out, "a") as f:
        f.write(f"{peak}\n")
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(sys.argv[1:]))
