"""Which bundle a runtime's command line creates a container from, read the way runc and crun read it.

Rule: pure functions of the argument list. The runtime wrapper cannot know which runtime it
fronts (the ``runtime`` setting may name runc, crun, or a runtime that passes its arguments on to
either), so it reads the command line with each grammar (``runc``: runc 1.1 and 1.2+, ``crun``:
crun up to 1.20 and 1.21+) and touches a config only when every reading agrees: each one accepts
the line, each one creates a container from it, and each one names the same ``config.json``.
A line one runtime rejects is one the wrapper cannot decide for sure (it may be that runtime),
so it is refused, and nothing is written. Checked against runc 1.1.5 and crun 1.8.1 here (under
``strace``) and the sources.
"""

from hook.routes.runtimeargs.crun import read_crun, read_crun_1_8
from hook.routes.runtimeargs.readings import READERS, creates
from hook.routes.runtimeargs.runc import read_runc_1_1, read_runc_1_2
from hook.routes.runtimeargs.values import CREATES, ArgsError, Creates

__all__ = [
    "ArgsError",
    "Creates",
    "CREATES",
    "READERS",
    "creates",
    "read_crun",
    "read_crun_1_8",
    "read_runc_1_1",
    "read_runc_1_2",
]
