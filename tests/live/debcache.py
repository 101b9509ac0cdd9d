"""Debian's containerd packages for the live NRI tests, fetched once and kept unpacked.

Rule: the packages come from the archive the machine's own apt sources name (read at run time, so
no archive host is written anywhere), through a private sources list for the wanted suite
(``trixie``: containerd 1.7, NRI off by default; ``sid``: containerd 2.x) and private apt state
(lists, caches, status, sources parts) under a temp dir: ``/etc/apt`` and dpkg's database are only
read, never written. ``apt-get download`` fetches the ``.deb``, ``dpkg-deb -x`` unpacks it into
``CACHE/containerd-<suite>``; a rerun finds it there (``READY`` names the version) and fetches
nothing. CI pre-fetches (``python -m tests.live.debcache``); a test on a cold cache fetches itself.

The cache is ``/var/cache/oci-device-hook-tests`` (``ODH_TEST_PKG_CACHE`` overrides): outside the
repository and outside ``/run`` (which the tests mount over). Concurrent workers take a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("ODH_TEST_PKG_CACHE", "/var/cache/oci-device-hook-tests"))
SUITES = ("trixie", "sid")
SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


@dataclass(frozen=True)
class Archive:
    """One ``deb`` source of the machine: where its archive is and the keyring that signs it."""

    uri: str
    keyring: str  # "" when the entry names none (apt's trusted keys then)


def _deb822(text: str) -> Iterator[dict[str, str]]:
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields:
            yield fields


def _one_line(text: str) -> Iterator[dict[str, str]]:
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) < 3 or words[0] != "deb":
            continue
        options: dict[str, str] = {}
        if words[1].startswith("["):
            end = next(i for i, w in enumerate(words) if w.endswith("]"))
            for opt in " ".join(words[1 : end + 1]).strip("[]").split():
                key, _, value = opt.partition("=")
                options[key.lower()] = value
            words = [words[0], *words[end + 1 :]]
        yield {
            "types": "deb",
            "uris": words[1],
            "suites": words[2],
            "signed-by": options.get("signed-by", ""),
        }


def machine_archive() -> Archive:
    """The machine's main archive: the first ``deb`` entry whose suites hold a release name (no
    ``-security``/``-updates`` suffix), as its sources say; ValueError when there is none."""
    for entry in _entries():
        if "deb" not in entry.get("types", "").split() or entry.get("enabled", "yes") == "no":
            continue
        suites = entry.get("suites", "").split()
        if any("-" not in s and "/" not in s for s in suites) and entry.get("uris"):
            return Archive(uri=entry["uris"].split()[0], keyring=entry.get("signed-by", ""))
    raise ValueError("no main Debian archive in /etc/apt/sources.list{,.d}: cannot fetch containerd")


def _entries() -> Iterator[dict[str, str]]:
    listfile, parts = SOURCES
    if listfile.is_file():
        yield from _one_line(listfile.read_text())
    for path in sorted(parts.glob("*")) if parts.is_dir() else []:
        if path.suffix == ".sources":
            yield from _deb822(path.read_text())
        elif path.suffix == ".list":
            yield from _one_line(path.read_text())


def _apt_options(scratch: Path, sources: Path) -> list[str]:
    options = {
        "Dir::State::Lists": scratch / "lists",
        "Dir::State::Status": "/dev/null",
        "Dir::State::extended_states": scratch / "extended_states",
        "Dir::Cache": scratch / "cache",
        "Dir::Etc::SourceList": sources,
        "Dir::Etc::SourceParts": scratch / "no-parts",
        "Dir::Etc::Preferences": scratch / "no-preferences",
        "Dir::Etc::PreferencesParts": scratch / "no-parts",
        "APT::Sandbox::User": "root",
    }
    for d in ("lists/partial", "cache/archives/partial", "no-parts"):
        (scratch / d).mkdir(parents=True, exist_ok=True)
    return [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} ... exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return proc.stdout


def fetch(suite: str, dest: Path) -> str:
    """Download containerd from ``suite`` and unpack it into ``dest`` (made here); its version."""
    archive = machine_archive()
    signed = f"[signed-by={archive.keyring}] " if archive.keyring else ""
    with tempfile.TemporaryDirectory(prefix="odh-apt-") as tmp:
        scratch = Path(tmp)
        sources = scratch / "sources.list"
        sources.write_text(f"deb {signed}{archive.uri} {suite} main\n")
        options = _apt_options(scratch, sources)
        _run(["apt-get", "-q", *options, "update"])
        (scratch / "debs").mkdir()
        _run(["apt-get", "-q", *options, "download", f"containerd/{suite}"], cwd=scratch / "debs")
        (deb,) = (scratch / "debs").glob("containerd_*.deb")
        version = _run(["dpkg-deb", "-f", str(deb), "Version"]).strip()
        _run(["dpkg-deb", "-x", str(deb), str(dest)])
    return version


def containerd_tree(suite: str) -> tuple[Path, str]:
    """The unpacked tree of ``suite``'s containerd (``usr/bin/containerd``...) and its version,
    fetched on a cold cache (under a lock: parallel workers fetch once)."""
    if suite not in SUITES:
        raise ValueError(f"suite {suite!r}: one of {', '.join(SUITES)}")
    CACHE.mkdir(parents=True, exist_ok=True)
    tree = CACHE / f"containerd-{suite}"
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = tree / "READY"
        if not ready.is_file() or os.environ.get("ODH_TEST_PKG_REFRESH"):
            partial = Path(tempfile.mkdtemp(prefix=f".containerd-{suite}-", dir=CACHE))
            try:
                version = fetch(suite, partial)
                (partial / "READY").write_text(version + "\n")
                old = CACHE / f".old-{suite}"
                shutil.rmtree(old, ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    tree.rename(old)
                partial.rename(tree)
                shutil.rmtree(old, ignore_errors=True)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
        return tree, ready.read_text().strip()


def main() -> int:
    """Pre-fetch every suite (CI, before pytest); a failure here is a failure of the run."""
    for suite in sys.argv[1:] or SUITES:
        tree, version = containerd_tree(suite)
        print(f"containerd {version} ({suite}) in {tree}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
