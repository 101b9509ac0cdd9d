"""``python -m hook``: the same entry as the console script."""

from hook.entry import run

run()
