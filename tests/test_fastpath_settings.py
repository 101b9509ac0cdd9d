"""Custom settings keep the fast path: the full path compiles them once, later containers reuse them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hook.routes import fastpath
from hook.sources import settingsfile as settings

INVENTORY = Path(__file__).resolve().parents[1] / "examples" / "node" / "inventory.json"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    target = tmp_path / "run" / "fastpath.json"
    monkeypatch.setattr(fastpath, "FASTPATH_CACHE", str(target))
    monkeypatch.setattr(settings, "FASTPATH_CACHE", target)
    return target


def write_settings(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_absent_or_commented_settings_use_defaults(tmp_path: Path, cache: Path) -> None:
    assert fastpath.fast_settings(str(tmp_path / "missing.yaml")) == (
        ("cdi.k8s.io/",),
        fastpath.DEFAULT_MOUNT_ROOT,
    )
    commented = write_settings(tmp_path, "---\n# privileged_allocation: reject\n\n")
    assert fastpath.fast_settings(str(commented)) == (("cdi.k8s.io/",), fastpath.DEFAULT_MOUNT_ROOT)


def test_custom_settings_need_the_full_path_once(tmp_path: Path, cache: Path) -> None:
    path = write_settings(tmp_path, "cdi_annotation_prefixes: [example.com/cdi-]\n")
    assert fastpath.fast_settings(str(path)) is None  # nothing compiled yet: take the full path
    assert settings.remember_for_fast_path(path, settings.load_settings(path)) is None
    assert fastpath.fast_settings(str(path)) == (("example.com/cdi-",), fastpath.DEFAULT_MOUNT_ROOT)


def test_an_edited_settings_file_invalidates_the_cache(tmp_path: Path, cache: Path) -> None:
    path = write_settings(tmp_path, "cdi_annotation_prefixes: [a.io/]\n")
    settings.remember_for_fast_path(path, settings.load_settings(path))
    path.write_text("cdi_annotation_prefixes: [b.io/, c.io/]\n")
    os.utime(path, ns=(1, 1))
    assert fastpath.fast_settings(str(path)) is None


def test_corrupt_cache_means_full_path(tmp_path: Path, cache: Path) -> None:
    path = write_settings(tmp_path, "privileged_allocation: reject\n")
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    assert fastpath.fast_settings(str(path)) is None


def test_custom_prefix_routes_a_container_to_the_full_path(tmp_path: Path, cache: Path) -> None:
    config = {"process": {"env": ["PATH=/bin"]}, "linux": {}}
    assert not fastpath.needs_decision(config, {"example.com/cdi-x": "v/c=d"})
    assert fastpath.needs_decision(config, {"example.com/cdi-x": "v/c=d"}, ("example.com/cdi-",))


def test_fast_path_answers_with_compiled_custom_settings(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_settings(tmp_path, "privileged_allocation: reject\n")
    settings.remember_for_fast_path(path, settings.load_settings(path))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {"env": ["PATH=/bin"]}}))
    state = json.dumps({"id": "c1", "pid": 1, "bundle": str(bundle)}).encode()
    assert fastpath.fast_path({"--config": [str(path)]}, state) is True


def test_live_full_path_reads_compiled_settings_without_yaml(tmp_path: Path) -> None:
    """The second device container under custom settings must not import yaml (about 30 ms)."""
    path = write_settings(tmp_path, f"log_file: {tmp_path}/hook.log\nprivileged_allocation: narrow\n")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    # privileged without an allocation: the full path runs and decides "none", so nothing is applied
    config = {"linux": {"resources": {"devices": [{"allow": True, "access": "rwm"}]}}}
    (bundle / "config.json").write_text(json.dumps(config))
    state = json.dumps({"id": "c1", "bundle": str(bundle)}).encode()
    code = (
        "import sys; from pathlib import Path; "
        "import hook.routes.fastpath as e, hook.sources.settingsfile as s; "
        f"e.FASTPATH_CACHE = {str(tmp_path / 'fp.json')!r}; s.FASTPATH_CACHE = Path(e.FASTPATH_CACHE); "
        "from hook.routes.live import run_live; "
        f"opts = {{'--config': [{str(path)!r}], '--inventory': [{str(INVENTORY)!r}]}}; "
        "rc = run_live(opts, sys.stdin.buffer.read()); "
        "print(rc, 'yaml' in sys.modules)"
    )
    runs = [
        subprocess.run([sys.executable, "-I", "-c", code], input=state, capture_output=True, check=True)
        for _ in range(2)
    ]
    assert [r.stdout.decode().split() for r in runs] == [["0", "True"], ["0", "False"]], runs[1].stderr


def test_the_decider_rechecks_the_compiled_record_only_when_its_file_changes(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: a warm decider calls remember on every request; reading and seal-checking the
    record each time cost ~0.2 ms. A found record is kept while fastpath.json's identity holds;
    removed (or rewritten), it is checked again and written again."""
    from hook.sources import warm

    path = write_settings(tmp_path, "cdi_annotation_prefixes: [example.com/cdi-]\n")
    calls: list[Path] = []
    real = settings._compiled

    def counted(p: Path, d: bytes) -> settings.Settings | None:
        calls.append(p)
        return real(p, d)

    monkeypatch.setattr(settings, "_compiled", counted)
    warm.enable()
    try:
        loaded = settings.load_settings(path)
        calls.clear()
        for _ in range(3):
            assert settings.remember_for_fast_path(path, loaded) is None
        assert len(calls) == 2  # the miss that wrote it, the hit that is then kept
        cache.unlink()
        assert settings.remember_for_fast_path(path, loaded) is None
        assert len(calls) == 3 and cache.exists()  # checked again, and written again
        assert fastpath.fast_settings(str(path)) == (("example.com/cdi-",), fastpath.DEFAULT_MOUNT_ROOT)
    finally:
        warm.enable(False)
