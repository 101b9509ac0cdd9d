"""write_log: one sorted JSON line per record, size rotation, and errors returned, never raised."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hook.adapters.log import write_log


def test_one_sorted_line_per_record(tmp_path: Path) -> None:
    log = tmp_path / "sub" / "hook.log"
    assert write_log({"id": "c1", "verdict": "apply"}, log) is None
    assert write_log({"verdict": "none", "id": "c2"}, log) is None
    lines = log.read_text().splitlines()
    assert lines == ['{"id": "c1", "verdict": "apply"}', '{"id": "c2", "verdict": "none"}']
    assert [json.loads(x)["id"] for x in lines] == ["c1", "c2"]


def test_newlines_in_values_stay_on_one_line(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    write_log({"reason": "a\nb"}, log)
    assert len(log.read_text().splitlines()) == 1


def test_rotation_keeps_backups_and_drops_the_oldest(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    for i in range(6):
        assert write_log({"n": i, "pad": "x" * 40}, log, max_bytes=130, backups=2) is None
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["hook.log", "hook.log.1", "hook.log.2"]
    newest = [json.loads(x)["n"] for x in log.read_text().splitlines()]
    assert newest == [4, 5]
    assert [json.loads(x)["n"] for x in (tmp_path / "hook.log.2").read_text().splitlines()] == [0, 1]


def test_zero_backups_truncates(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    for i in range(3):
        write_log({"n": i, "pad": "x" * 60}, log, max_bytes=100, backups=0)
    assert [p.name for p in tmp_path.iterdir()] == ["hook.log"]
    assert json.loads(log.read_text())["n"] == 2


def test_failure_is_returned_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    err = write_log({"id": "c"}, blocker / "hook.log")
    assert err is not None and str(blocker / "hook.log") in err


def test_unserializable_record_is_returned_as_error(tmp_path: Path) -> None:
    err = write_log({"k": float("nan"), 1: {2}}, tmp_path / "hook.log")  # mixed key types cannot sort
    assert err is not None and "cannot write log" in err


def test_symlinked_log_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    (tmp_path / "hook.log").symlink_to(target)
    assert write_log({"id": "c"}, tmp_path / "hook.log") is not None
    assert target.read_text() == "keep\n"


def test_lines_are_json_dumps_text_without_importing_json() -> None:
    """``dumps`` (json's C encoder, so the served start path loads no ``re``) writes exactly what
    ``json.dumps(sort_keys=True, default=str)`` writes, whatever the record holds."""
    import json
    from pathlib import Path

    from hook.adapters.log import dumps

    records = [
        {"b": [1, 2.5, -0.0, 1e300, 10**40], "a": {"z": None, "y": True, "\u2028": "\x1b\u00e9\ud800"}},
        {"path": Path("/x"), "set": {3}, "nested": [[{"k": "v"}]], "inf": float("inf")},
        {},
    ]
    for rec in records:
        assert dumps(rec) == json.dumps(rec, sort_keys=True, default=str)


# --- issue 36 item 1: the log renames, truncates or replaces only what the hook created as its log


PRECIOUS = "precious\n" * 600  # 5,400 bytes: past max_bytes below, so the first design rotated it


def test_a_file_the_hook_did_not_create_is_never_rotated(tmp_path: Path) -> None:
    """A host file at the log path (settings naming it) past the size limit: not renamed to .1,
    not replaced, not written; the error text says why."""
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    err = write_log({"id": "c"}, victim, max_bytes=4096)
    assert err is not None and "did not create" in err, err
    assert victim.read_text() == PRECIOUS and not (tmp_path / "victim.1").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]


def test_zero_backups_never_removes_a_foreign_file(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    assert write_log({"id": "c"}, victim, max_bytes=4096, backups=0) is not None
    assert victim.read_text() == PRECIOUS


def test_a_foreign_file_at_a_backup_name_is_never_replaced(tmp_path: Path) -> None:
    """Our log is rotated only while every name it moves onto is absent or ours: a host file at
    ``hook.log.2`` stops the rotation (the oldest backup would replace it)."""
    log = tmp_path / "hook.log"
    for i in range(6):
        assert write_log({"n": i, "pad": "x" * 40}, log, max_bytes=130, backups=2) is None
    foreign = tmp_path / "hook.log.2"
    (tmp_path / "host-file").write_text(PRECIOUS)
    (tmp_path / "host-file").rename(foreign)  # over the oldest backup: a host file holds its name
    for i in range(4):
        write_log({"n": i, "pad": "x" * 40}, log, max_bytes=130, backups=2)
    assert foreign.read_text() == PRECIOUS
    assert (tmp_path / "hook.log.1").exists()  # nothing of ours was dropped either


def test_a_hardlink_at_the_log_path_is_not_written_through(tmp_path: Path) -> None:
    """A second name for another file (``ln`` by a container with the host's log dir) is never
    appended to: the file it names is not the hook's log."""
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    os.link(victim, tmp_path / "hook.log")
    err = write_log({"id": "c"}, tmp_path / "hook.log")
    assert err is not None and victim.read_text() == "keep\n"
