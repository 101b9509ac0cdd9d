"""A private, installed copy of the tree that a mutant is written into.

Rule: the mutant is what every test runs, and nothing outside the copy changes. The tree is
copied into a temp dir and installed there the way ``.ci/run`` installs it (its own venv,
``pip install -e '.[test]'``), and pytest runs with that venv's python and ``bin/`` first on
PATH: ``python -I -m hook``, the ``hook`` console script, the launcher and the live runc hooks
resolve ``hook`` to the copy, not to the checkout ``bench/mutate`` was started from (the old
``PYTHONPATH`` copy reached only in-process tests). The real tree is never written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.mutgen import Mutant, apply

REPO = Path(__file__).resolve().parents[1]
_IGNORE = shutil.ignore_patterns(
    ".venv",
    "venv",
    ".git",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "*.egg-info",
    ".hypothesis",
    "build",
    "dist",
)


@dataclass(frozen=True, slots=True)
class Outcome:
    rc: int  # pytest's exit status; -1: the timeout ran out
    seconds: float
    killer: str  # the first failing test id, "" if none
    tail: str  # the end of pytest's output
    failed: tuple[str, ...] = ()  # every failing test id of the short summary (``-rfE``)


class Sandbox:
    """``root/tree`` (the copy) and ``root/venv`` (its install)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tree = root / "tree"
        self.venv = root / "venv"
        self.python = self.venv / "bin" / "python"

    def create(self, extra: Sequence[str] = ("coverage",)) -> None:
        shutil.copytree(REPO, self.tree, ignore=_IGNORE, symlinks=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(self.venv)], check=True)
        subprocess.run(
            [str(self.python), "-m", "pip", "install", "-q", "-e", f"{self.tree}[test]", *extra],
            check=True,
            cwd=self.root,
        )
        self.check_install()

    def check_install(self) -> None:
        """``python -I`` and the ``hook`` command must both load the copy's package."""
        code = "import hook, sys; sys.stdout.write(hook.__path__[0])"
        got = subprocess.run(
            [str(self.python), "-I", "-c", code], capture_output=True, text=True, check=True, cwd="/"
        ).stdout
        if Path(got).resolve() != (self.tree / "hook").resolve():
            raise SystemExit(f"bench/mutate: the copy's venv loads hook from {got}, not {self.tree}")
        if not (self.venv / "bin" / "hook").exists():
            raise SystemExit("bench/mutate: the copy's venv has no `hook` command")

    def site_packages(self) -> Path:
        return next((self.venv / "lib").glob("python3*/site-packages"))

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env["VIRTUAL_ENV"] = str(self.venv)
        env["PATH"] = f"{self.venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return env

    def pytest(self, args: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Outcome:
        """One pytest run in the copy; on timeout its whole process group is killed."""
        cmd = [str(self.python), "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *args]
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=self.tree,
            env=dict(env or self.env()),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            _stop(proc)
            out, rc = b"", -1
        except BaseException:  # stopped (SIGTERM/SIGINT): the tests go too, the caller restores
            _stop(proc)
            raise
        text = out.decode(errors="replace")
        failed = tuple(
            line.split(" ", 1)[1].split(" - ", 1)[0]
            for line in text.splitlines()
            if line.startswith(("FAILED ", "ERROR ")) and " " in line
        )
        killer = failed[0] if failed else ""
        return Outcome(rc, time.monotonic() - start, killer, text[-3000:], failed)

    def mutate(self, m: Mutant, stamp: int) -> tuple[str, int, int] | None:
        """Write the mutant; returns (original text, line, original mtime) for ``restore``."""
        path = self.tree / m.module
        original = path.read_text()
        applied = apply(original, m)
        if applied is None:
            return None
        text, lineno = applied
        mtime = path.stat().st_mtime_ns
        path.write_text(text)
        # Its own mtime, so no cached bytecode of another mutant (or of the original) matches.
        t = mtime + stamp * 1_000_000_000_000
        os.utime(path, ns=(t, t))
        return original, lineno, mtime

    def restore(self, m: Mutant, saved: tuple[str, int, int]) -> None:
        path = self.tree / m.module
        path.write_text(saved[0])
        os.utime(path, ns=(saved[2], saved[2]))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """TERM the group (pytest's finalizers remove containers and cgroups), KILL after 60 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
