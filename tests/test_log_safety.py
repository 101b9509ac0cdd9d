"""#11 items 4 and 9: the log never blocks or fails a container; error lines say each part once."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from hook.adapters.log import MAX_STRING, write_log
from hook.core.errors import ApplyError, InputError


def timed(path: Path) -> tuple[str | None, float]:
    """``write_log`` on a thread: a blocked open fails the test instead of hanging it."""
    out: list[str | None] = []
    start = time.monotonic()
    t = threading.Thread(target=lambda: out.append(write_log({"verdict": "none"}, path)), daemon=True)
    t.start()
    t.join(5)
    assert out, f"write_log blocked on {path}"
    return out[0], time.monotonic() - start


def test_fifo_without_reader_is_dropped_not_waited_for(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "hook.log")
    problem, took = timed(tmp_path / "hook.log")
    assert problem is not None and took < 1


def test_fifo_with_a_stuck_reader_is_not_written(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "hook.log")
    reader = os.open(tmp_path / "hook.log", os.O_RDONLY | os.O_NONBLOCK)  # opens, never reads
    try:
        problem, took = timed(tmp_path / "hook.log")
        assert problem is not None and "not a regular file" in problem and took < 1
        assert os.read(reader, 100) == b""  # nothing was written into the pipe
    finally:
        os.close(reader)


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/null"])
def test_symlink_to_a_device_is_not_followed(tmp_path: Path, target: str) -> None:
    (tmp_path / "hook.log").symlink_to(target)
    problem, _ = timed(tmp_path / "hook.log")
    assert problem is not None


def test_a_directory_at_the_log_path_is_an_error_text(tmp_path: Path) -> None:
    (tmp_path / "hook.log").mkdir()
    assert timed(tmp_path / "hook.log")[0] is not None


def test_strings_are_capped_and_one_line(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    assert write_log({"verdict": "none", "id": 'x\n{"forged": 1}\x1b' + "A" * 100_000}, log) is None
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and len(lines[0]) < MAX_STRING + 200
    assert json.loads(lines[0])["id"].startswith("x\n{")


def test_error_line_says_each_part_once() -> None:
    assert str(ApplyError("device nodes", "device nodes", "No space left on device")) == (
        "device nodes: No space left on device"
    )
    assert str(InputError("/etc/x.yaml", "cap_access", "duplicate key (line 3)")) == (
        "/etc/x.yaml: cap_access: duplicate key (line 3)"
    )


def test_error_line_escapes_container_strings() -> None:
    line = str(InputError("config.json", "process.env.A\x1b[2J", "bad value 'x\ny\x00'"))
    assert line == "config.json: process.env.A\\x1b[2J: bad value 'x\\ny\\x00'"


def test_hook_log_prints_container_strings_escaped(tmp_path: Path) -> None:
    from hook.tools.logread import render

    record = {
        "time": "2026-01-01T00:00:00.000Z",
        "verdict": "deny",
        "container": {"id": "c\x1b[2J"},
        "reason": "NVIDIA_VISIBLE_DEVICES=x\r\nforged\x07",
        "pod": {"namespace": "n", "name": "p\x1b]0;t"},
    }
    text = render([record], 0, "text")
    assert text.count("\n") == 1 and not any(ch in text[:-1] for ch in "\x1b\r\n\x07"), text
    assert "\\x1b[2J" in text and "\\r\\nforged\\x07" in text
