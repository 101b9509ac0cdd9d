"""The runtime wrapper starts the real runtime with ``posix.execve`` (no ``os`` on a plain
container's path: issue 35); it must find and fail exactly as ``os.execvp`` did.

Each case runs in a child process (an exec replaces it): once through ``hook.routes.wrapper._exec``
and once through ``os.execvp``, with the same ``PATH``, and the outcomes (what ran, with which
arguments and environment, or which error) must be the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHILD = """
import json, os, posix, sys
sys.path.insert(0, {repo!r})
how, name, path = sys.argv[1], sys.argv[2], sys.argv[3]
env = dict(posix.environ)
if path == "-":
    env.pop(b"PATH", None)
else:
    env[b"PATH"] = path.encode()
try:
    if how == "ours":
        from hook.routes.wrapper import _exec

        _exec(name, [name, "a b", "--x"], env)
    else:
        os.environ.clear()
        os.environ.update({{k.decode(): v.decode() for k, v in env.items()}})
        os.execvp(name, [name, "a b", "--x"])
except OSError as exc:
    print(json.dumps({{"error": type(exc).__name__, "errno": exc.errno}}))
"""


def _tool(path: Path, mode: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{path.parent.name}|$*|$MARK"\n')
    path.chmod(mode)
    return path


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    _tool(tmp_path / "noexec" / "tool", 0o644)  # EACCES: remembered, the search goes on
    _tool(tmp_path / "good" / "tool", 0o755)
    _tool(tmp_path / "other" / "tool", 0o755)
    (tmp_path / "file").write_text("")  # ENOTDIR when used as a PATH entry
    return {"noexec": tmp_path / "noexec", "good": tmp_path / "good", "other": tmp_path / "other",
            "file": tmp_path / "file", "missing": tmp_path / "missing"}  # fmt: skip


def _run(how: str, name: str, path: str, cwd: Path) -> str:
    env = {**os.environ, "MARK": "m\u00e9"}
    code = CHILD.format(repo=str(REPO))
    proc = subprocess.run([sys.executable, "-I", "-c", code, how, name, path], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=30)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("tool", "{missing}:{file}:{noexec}:{good}:{other}"),  # skips ENOENT, ENOTDIR, EACCES: good
        ("tool", "{noexec}:{missing}"),  # EACCES, not the later ENOENT
        ("tool", "{missing}:{file}"),  # the last error
        ("tool", ""),  # an empty entry is the working directory
        ("tool", "{other}::{good}"),
        ("{good}/tool", "{other}"),  # a slash: no search
        ("{noexec}/tool", "{good}"),
        ("nosuch", "-"),  # no PATH: /bin:/usr/bin
        ("echo", "-"),
    ],
)
def test_exec_finds_and_fails_as_execvp(dirs: dict[str, Path], tmp_path: Path, name: str, path: str) -> None:
    name, path = name.format(**dirs), path.format(**dirs)
    cwd = dirs["good"] if path == "" else tmp_path
    ours, theirs = _run("ours", name, path, cwd), _run("execvp", name, path, cwd)
    assert ours == theirs
    if ours.startswith("{"):
        assert json.loads(ours)["error"] in {"FileNotFoundError", "PermissionError", "NotADirectoryError"}
