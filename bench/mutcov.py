"""Which tests reach which line of hook/, from one coverage run of the whole suite.

Rule: a mutant's test subset comes from measured coverage of the current tree, never a list
kept by hand. Every process of the copy's venv is measured (``bench/mutcov_site.py``), in
pytest's own process the context is switched to the test id at each test (``--cov-context=test``
in pytest-cov's terms), in subprocesses it is the id of the test that started them. A line
reached outside any test (module level, run at collection) maps to ``""``: such a mutant gets
the whole suite.

Also a pytest plugin (``-p bench.mutcov``): it switches contexts and records test durations.
"""

from __future__ import annotations

import ast
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CTL_ENV = "ODH_MUTCOV_CTL"
_SITE = Path(__file__).with_name("mutcov_site.py")


def install(site_packages: Path, ctl: Path, src: Path) -> None:
    """Measure every process of this venv (until ``uninstall``)."""
    shutil.rmtree(ctl / "data", ignore_errors=True)
    (ctl / "data").mkdir(parents=True)
    text = _SITE.read_text().replace("@CTL@", str(ctl)).replace("@SRC@", str(src))
    (site_packages / "_odh_mutcov.py").write_text(text)
    (site_packages / "_odh_mutcov.pth").write_text("import _odh_mutcov\n")


def uninstall(site_packages: Path, ctl: Path) -> None:
    for name in ("_odh_mutcov.pth", "_odh_mutcov.py"):
        (site_packages / name).unlink(missing_ok=True)


def combine(ctl: Path, tree: Path) -> dict[str, dict[int, list[str]]]:
    """module (relative path) -> line -> test ids ("" for outside any test)."""
    import coverage

    cov = coverage.Coverage(data_file=str(ctl / "data" / "cov"), config_file=False)
    cov.combine([str(ctl / "data")], keep=True)
    data = cov.get_data()
    out: dict[str, dict[int, list[str]]] = {}
    for f in data.measured_files():
        p = Path(f).resolve()
        try:
            rel = str(p.relative_to(tree.resolve()))
        except ValueError:
            continue
        by_line = data.contexts_by_lineno(f)
        out[rel] = {int(n): sorted(set(c)) for n, c in by_line.items()}
    return out


def statement_lines(source: str) -> dict[int, int]:
    """line -> first line of the innermost statement spanning it (coverage records that one)."""
    out: dict[int, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and node.end_lineno is not None:
            for n in range(node.lineno, node.end_lineno + 1):
                if n not in out or out[n] < node.lineno:
                    out[n] = node.lineno
    return out


# --- the pytest plugin --------------------------------------------------------------------------


def _ctl() -> Path | None:
    import os

    value = os.environ.get(CTL_ENV)
    return Path(value) if value else None


_DURATIONS: dict[str, float] = {}
_FAILED: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    ctl = _ctl()
    cov = _current()
    if ctl is not None:
        (ctl / "current").write_text(item.nodeid)
    if cov is not None:
        cov.switch_context(item.nodeid)
    start = time.monotonic()
    yield
    _DURATIONS[item.nodeid] = time.monotonic() - start
    if cov is not None:
        cov.switch_context("")
    if ctl is not None:
        (ctl / "current").unlink(missing_ok=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _FAILED.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    ctl = _ctl()
    if ctl is not None:
        (ctl / "durations.json").write_text(json.dumps({"durations": _DURATIONS, "failed": _FAILED}))


def _current() -> object | None:
    try:
        import coverage
    except ImportError:
        return None
    return coverage.Coverage.current()
