"""Coverage of every Python process of the copy's venv, tagged with the test that started it.

Copied into the copy's site-packages (with a ``.pth`` that imports it) only while
``bench/mutate`` collects coverage; it imports nothing from the project, so it works under
``python -I``. The test id comes from a file the pytest plugin (``bench.mutcov``) rewrites at
each test, not from the environment: runc and the tests hand the hook a scrubbed one. The hook
ends live runs with ``os._exit`` (no atexit), so ``os._exit`` saves the data first.
"""

import contextlib
import os

_CTL = "@CTL@"
_SRC = "@SRC@"


def _start() -> None:
    try:
        with open(os.path.join(_CTL, "current")) as f:
            context = f.read()
    except OSError:
        context = ""  # the pytest process itself, before its first test (the plugin switches)
    import coverage

    cov = coverage.Coverage(
        data_file=os.path.join(_CTL, "data", "cov"),
        data_suffix=True,
        source=[_SRC],
        context=context,
        config_file=False,
        auto_data=True,
    )
    cov.start()
    real_exit = os._exit

    def _exit(code: int) -> None:
        with contextlib.suppress(Exception):  # measurement never changes the exit
            cov.stop()
            cov.save()
        real_exit(code)

    os._exit = _exit


if os.path.isdir(_CTL):
    with contextlib.suppress(Exception):  # a process that cannot be measured still runs
        _start()
