"""bench/mutate's sampling and coverage mapping (issue 24): what the published score rests on.

The score is only as honest as its sample: fresh (a seed per run, reproducible from the seed),
over every module of hook/ with the safety modules first, and not blind to typing-only blocks
(``TYPE_CHECKING = True`` is killed by the import-budget tests, g159). The installed-copy and
subprocess-coverage parts are checked by every run itself (the canary, docs/testing.md).
"""

from __future__ import annotations

from pathlib import Path

from bench import mutcov, mutgen

REPO = Path(__file__).resolve().parents[1]


def test_the_same_seed_draws_the_same_mutants_and_another_seed_others() -> None:
    a = mutgen.sample(REPO, 11, 2, 3, only=["hook/adapters/marker.py", "hook/adapters/allowlist.py"])
    b = mutgen.sample(REPO, 11, 2, 3, only=["hook/adapters/marker.py", "hook/adapters/allowlist.py"])
    c = mutgen.sample(REPO, 12, 2, 3, only=["hook/adapters/marker.py", "hook/adapters/allowlist.py"])
    assert a == b
    assert [m.row() for m in a] != [m.row() for m in c]
    assert all(m.ident.startswith("s11-") for m in a)


def test_every_module_with_code_is_sampled_and_the_safety_modules_come_first() -> None:
    drawn = mutgen.sample(REPO, 5, 1, 2)
    modules = [m.module for m in drawn]
    with_code = [m for m in mutgen.modules(REPO) if mutgen.candidates(m, (REPO / m).read_text())]
    assert sorted(set(modules)) == sorted(with_code)
    safety = [mutgen.is_safety(m) for m in modules]
    assert safety == sorted(safety, reverse=True), "a non-safety module is drawn before a safety one"
    for name in (
        "core/hostdev",
        "adapters/allowlist",
        "adapters/marker",
        "sources/kubelet/checkpoint",
        "sources/cachefile",
        "routes/precreate",
        "adapters/specwriter",
    ):
        assert f"hook/{name}.py" in modules


def test_a_sampled_mutant_applies_and_compiles() -> None:
    for m in mutgen.sample(REPO, 3, 1, 1):
        source = (REPO / m.module).read_text()
        applied = mutgen.apply(source, m)
        assert applied is not None, m
        assert applied[0] != source
        compile(applied[0], m.module, "exec")


def test_type_checking_flags_are_mutated() -> None:
    """g159: a typing-only import at run time is a regression (start-up budget), not equivalent."""
    source = (REPO / "hook/sources/nvidia/model.py").read_text()
    news = [m.new for m in mutgen.candidates("hook/sources/nvidia/model.py", source)]
    assert any(n.startswith("TYPE_CHECKING = (True)") for n in news)


def test_a_continuation_line_maps_to_its_statement() -> None:
    source = "x = 1\nif (x and\n        x > 0):\n    y = [\n        1,\n    ]\n"
    lines = mutcov.statement_lines(source)
    assert lines[3] == 2
    assert lines[5] == 4
    assert lines[1] == 1
