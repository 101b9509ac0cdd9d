"""bench/mutate: fresh mutants of every module of hook/, each run against every test that reaches it.

Rule: the score measures the suite as CI runs it, on mutants nobody wrote tests against.

- **Fresh sample.** ``bench.mutgen`` draws the mutants from all AST candidates of every module
  (safety modules first, larger share) with a seed: a new one each run unless ``--seed`` is
  given; the seed and commit are in the report.
- **The mutant is installed.** ``bench.mutsandbox`` copies the tree into a temp dir and installs
  it into a venv of its own (as ``.ci/run`` does); every test, ``python -I``, the ``hook``
  command, the launcher and the live runc hooks execute the mutated copy. A canary mutant
  (``hook/__main__.py`` exits 97: only a ``python -m hook`` subprocess reaches it) runs first;
  the run stops if it survives.
- **Every test that can reach it.** By default a mutant's tests are those that executed its line
  in a coverage run of the same copy (``bench.mutcov``: per-test contexts, subprocesses
  included); a line reached outside any test (module level) gets the whole suite. ``--full``
  runs the whole suite for every mutant. Either way a survivor is re-run against the whole suite
  before it is reported (``--no-confirm`` skips that, and says so).
- **Timeouts are not kills.** A run past its limit (3x the subset's measured time + 60 s) is
  counted as a timeout, apart.
- **Equivalence is a claim, re-checked.** ``bench/equivalent.tsv`` names each mutant claimed
  equivalent and why; ``--claims`` runs each against the whole suite and reports any that is
  killed (a refuted claim).

Runs one pytest at a time (the machine is shared); use ``nice -n 19``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench import mutcov
from bench.mutgen import Mutant, is_safety, read_tsv, sample
from bench.mutsandbox import REPO, Outcome, Sandbox

HAND = REPO / "bench" / "mutants.tsv"
CLAIMS = REPO / "bench" / "equivalent.tsv"
DOC = REPO / "docs" / "testing.md"
BEGIN, END = "<!-- mutation:begin -->", "<!-- mutation:end -->"
Claims = dict[tuple[str, int, str, str], str]  # (module, occurrence, line, new) -> reason
CANARY = Mutant("canary", "hook/__main__.py", 1, "run()", "raise SystemExit(97)", "canary")
NOT_DEB = ["-m", "not installs_package"]


@dataclass(frozen=True, slots=True)
class Result:
    mutant: Mutant
    status: str  # killed | timeout | survived | flaky (the killer passed alone) | stale
    seconds: float
    lineno: int = 0
    killer: str = ""  # the first failing test id
    tests: int = 0  # size of the subset run (0: the whole suite)
    how: str = ""  # "subset", "full", or "subset+full" (survived the subset, re-run whole)


class Runner:
    def __init__(
        self, box: Sandbox, marks: Sequence[str], full_seconds: float, module_subset: bool = False
    ) -> None:
        self.box = box
        self.module_subset = module_subset
        self.marks = list(marks)
        self.full_seconds = full_seconds
        self.cover: dict[str, dict[int, list[str]]] = {}
        self.durations: dict[str, float] = {}
        self.stamp = 0

    def subset(self, m: Mutant, lineno: int) -> tuple[list[str], str]:
        """The tests to run, cheapest file first, and "subset" or "full".

        "subset": the test ids that executed the mutant's statement. "full": its line also ran
        outside any test (module level, at collection), so every test of the suite runs, those
        that executed it first."""
        lines = self.cover.get(m.module, {})
        source = (self.box.tree / m.module).read_text()
        stmt = mutcov.statement_lines(source).get(lineno, lineno)
        ids = set(lines.get(stmt, [])) | set(lines.get(lineno, []))
        whole = "" in ids
        ids.discard("")
        first = self._cheapest(ids)
        if not whole:
            return first, "subset"
        if self.module_subset:  # every test that ran any line of the module (time-boxed runs)
            reach = {t for line_ids in lines.values() for t in line_ids if t} & set(self.durations)
            return self._cheapest(reach), "module"
        return first + self._cheapest(set(self.durations) - ids), "full"

    def _cheapest(self, ids: set[str]) -> list[str]:
        files: dict[str, list[str]] = {}
        for t in sorted(ids):
            files.setdefault(t.split("::")[0], []).append(t)
        order = sorted(files, key=lambda f: sum(self.durations.get(t, 1.0) for t in files[f]))
        return [t for f in order for t in files[f]]

    def run(self, m: Mutant, full: bool, limit: float | None = None) -> Result:
        self.stamp += 1
        saved = self.box.mutate(m, self.stamp)
        if saved is None:
            return Result(m, "stale", 0.0)
        lineno = saved[1]
        try:
            if full:
                ids, how = [*self.durations], "full"
                if not ids:  # --full: no coverage run, the suite in its own order
                    out = self._pytest([], None, limit or 60 + 3 * self.full_seconds)
            else:
                ids, how = self.subset(m, lineno)
            if ids:
                secs = sum(self.durations.get(t, 1.0) for t in ids)
                paths = ["tests"] if how == "full" else sorted({t.split("::")[0] for t in ids})
                out = self._pytest(paths, ids, 60 + 3 * secs)
            elif how == "subset":
                out = Outcome(0, 0.0, "", "")  # no test executes this line
            status = "timeout" if out.rc == -1 else "survived" if out.rc == 0 else "killed"
            if status == "killed" and out.killer:
                # A kill counts only if the killing test fails again, alone, on the same mutant:
                # on a loaded machine a live test can fail by timing, and that is no kill.
                again = self._pytest([out.killer.split("::")[0]], [out.killer], 600)
                if again.rc == 0:
                    status = "flaky"
        finally:
            self.box.restore(m, saved)
        if out.rc in (2, 3, 4):  # interrupted, internal error, usage error: not a kill
            raise SystemExit(f"bench/mutate: pytest exited {out.rc} on {m.ident}:\n{out.tail}")
        return Result(m, status, out.seconds, lineno, out.killer, len(ids), how)

    def _pytest(self, paths: Sequence[str], ids: Sequence[str] | None, timeout: float) -> Outcome:
        env = self.box.env()
        args = ["-x", *self.marks]
        if ids is not None:
            sel = self.box.root / "select.json"
            sel.write_text(json.dumps(list(ids)))
            env["ODH_MUTSELECT"] = str(sel)
            args += ["-p", "bench.mutselect", *paths]
        return self.box.pytest(args, timeout, env)


def collect_coverage(
    box: Sandbox, marks: Sequence[str], drop_failing: bool = False
) -> tuple[dict[str, dict[int, list[str]]], dict[str, float]]:
    """One measured run of the whole suite; tests that fail only because they are measured
    (import budgets see ``coverage`` loaded) must pass when re-run unmeasured. Those that fail
    unmeasured too fail on the unmutated copy: the run stops, or with ``drop_failing`` they are
    left out of every mutant's tests (a test that always fails would count as every kill) and
    listed in ``<workdir>/excluded.json`` for the report."""
    ctl = box.root / "cov"
    ctl.mkdir(exist_ok=True)
    mutcov.install(box.site_packages(), ctl, box.tree / "hook")
    try:
        env = {**box.env(), mutcov.CTL_ENV: str(ctl)}
        out = box.pytest([*marks, "-p", "bench.mutcov"], 4 * 3600, env)
    finally:
        mutcov.uninstall(box.site_packages(), ctl)
    info = json.loads((ctl / "durations.json").read_text())
    cover = _combine_in_copy(box, ctl)
    failed = sorted(set(info["failed"]))
    print(
        f"bench/mutate: coverage run {out.seconds / 60:.1f} min, {len(info['durations'])} tests, "
        f"{len(failed)} failed while measured",
        flush=True,
    )
    if failed:
        sel = box.root / "select.json"
        sel.write_text(json.dumps(failed))
        again = box.pytest(["-p", "bench.mutselect", *marks], 3600, {**box.env(), "ODH_MUTSELECT": str(sel)})
        if again.rc != 0 and not drop_failing:
            raise SystemExit(f"bench/mutate: tests fail on the unmutated copy:\n{again.tail}")
        if again.rc != 0:
            bad = set(again.failed)
            (box.root / "excluded.json").write_text(json.dumps(sorted(bad)))
            print(f"bench/mutate: {len(bad)} tests fail on the unmutated copy, left out", flush=True)
            for lines in cover.values():
                for n, ids in lines.items():
                    lines[n] = [t for t in ids if t not in bad]
            info["durations"] = {t: d for t, d in info["durations"].items() if t not in bad}
    return cover, info["durations"]


def _combine_in_copy(box: Sandbox, ctl: Path) -> dict[str, dict[int, list[str]]]:
    """``mutcov.combine`` run by the copy's venv, which has ``coverage`` (the one running
    bench/mutate need not)."""
    out = box.root / "cover.json"
    code = (
        "import json, sys; from pathlib import Path; from bench import mutcov; "
        "Path(sys.argv[3]).write_text(json.dumps(mutcov.combine(Path(sys.argv[1]), Path(sys.argv[2]))))"
    )
    subprocess.run([str(box.python), "-c", code, str(ctl), str(box.tree), str(out)], cwd=box.tree, check=True)
    return {m: {int(k): v for k, v in ls.items()} for m, ls in json.loads(out.read_text()).items()}


def interleave(mutants: Sequence[Mutant]) -> list[Mutant]:
    """Round-robin over modules (each module's mutants in id order): a run cut by ``--minutes``
    then leaves every module scored on part of its sample, not the last modules unscored."""
    by_module: dict[str, list[Mutant]] = {}
    for m in mutants:
        by_module.setdefault(m.module, []).append(m)
    queues = list(by_module.values())
    out: list[Mutant] = []
    while queues:
        out += [q.pop(0) for q in queues]
        queues = [q for q in queues if q]
    return out


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip()

    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    return git("rev-parse", "--short", "HEAD") + dirty


def _group(module: str) -> str:
    return "hook/adapters/apply/*" if module.startswith("hook/adapters/apply/") else module


def report(results: Sequence[Result], header: Sequence[str], claims: Claims) -> str:
    counted = [
        r
        for r in results
        if r.status in ("killed", "survived", "timeout", "flaky") and r.mutant.origin != "canary"
    ]
    groups: dict[str, list[Result]] = {}
    for r in counted:
        groups.setdefault(_group(r.mutant.module), []).append(r)

    def claimed(r: Result) -> bool:
        m = r.mutant
        return r.status in ("survived", "flaky") and (m.module, m.occurrence, m.line, m.new) in claims

    def row(name: str, rs: Sequence[Result], safety: bool = False) -> str:
        k = sum(r.status == "killed" for r in rs)
        t = sum(r.status == "timeout" for r in rs)
        s = len(rs) - k - t
        e = sum(claimed(r) for r in rs)
        pct = f"{100 * k / len(rs):.1f} %" if rs else "-"
        net = f"{100 * k / (len(rs) - e):.1f} %" if len(rs) > e else "-"
        return f"| {name} | {'yes' if safety else ''} | {len(rs)} | {k} | {t} | {s} | {e} | {pct} | {net} |"

    lines = [
        BEGIN,
        *header,
        "",
        "| module | safety | mutants | killed | timeout | survived | of them claimed equivalent "
        "| killed/mutants | killed/(mutants - claimed) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = sorted(groups, key=lambda g: (not is_safety(g.rstrip("*")), g))
    lines += [row(f"`{g}`", groups[g], is_safety(g.rstrip("*"))) for g in names]
    lines.append(row("**safety modules**", [r for r in counted if is_safety(r.mutant.module)]))
    lines.append(row("**all**", counted))
    surv = [r for r in counted if r.status in ("survived", "flaky")]
    lines += ["", f"Survivors ({len(surv)}; each survived the whole suite unless marked):", ""]
    for r in surv:
        m = r.mutant
        claim = claims.get((m.module, m.occurrence, m.line, m.new))
        note = f" — claimed equivalent: {claim}" if claim else ""
        unconfirmed = "" if "full" in r.how else " (subset only, not re-run on the whole suite)"
        if r.how == "module":
            unconfirmed = " (a module-level line: run against the tests reaching its module, not the suite)"
        if r.status == "flaky":
            unconfirmed = f" (its subset failed at `{r.killer}`, which passed alone on the mutant: no kill)"
        lines.append(
            f"- `{m.ident}` `{m.module}:{r.lineno}` ({m.origin}): `{m.line}` → `{m.new}`{unconfirmed}{note}"
        )
    if not surv:
        lines.append("- none")
    tout = [r for r in counted if r.status == "timeout"]
    if tout:
        lines += [
            "",
            "Timeouts: " + ", ".join(f"`{r.mutant.ident}` `{r.mutant.module}:{r.lineno}`" for r in tout),
        ]
    stale = [r for r in results if r.status == "stale"]
    if stale:
        lines += [
            "",
            "Stale (line not found, not counted): " + ", ".join(f"`{r.mutant.ident}`" for r in stale),
        ]
    lines.append(END)
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    head, rest = doc.split(BEGIN, 1)
    DOC.write_text(head + text + rest.split(END, 1)[1])


def read_claims() -> Claims:
    out = {}
    if CLAIMS.exists():
        for raw in CLAIMS.read_text().splitlines():
            if raw.strip() and not raw.startswith("#"):
                module, occ, line, new, reason = raw.split("\t")[:5]
                out[(module, int(occ), line, new)] = reason
    return out


def claim_mutants() -> list[Mutant]:
    out = []
    if CLAIMS.exists():
        rows = [r for r in CLAIMS.read_text().splitlines() if r.strip() and not r.startswith("#")]
        for i, raw in enumerate(rows, 1):
            module, occ, line, new, _reason = raw.split("\t")[:5]
            out.append(Mutant(f"e{i:02d}", module, int(occ), line, new, "claim"))
    return out


def _write_log(path: Path, r: Result) -> None:
    with path.open("a") as f:
        m = r.mutant
        f.write(
            "\t".join([m.row(), r.status, f"{r.seconds:.1f}", str(r.lineno), r.how, str(r.tests), r.killer])
            + "\n"
        )


def read_log(path: Path) -> list[Result]:
    """A results log back as results; a later line for the same mutant (its whole-suite re-run)
    replaces the earlier one."""
    out: dict[str, Result] = {}
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        f = raw.split("\t")
        m = Mutant(f[0], f[1], int(f[2]), f[3], f[4], f[5])
        out[m.ident] = Result(m, f[6], float(f[7]), int(f[8]), f[11] if len(f) > 11 else "", int(f[10]), f[9])
    return list(out.values())


def _stop_cleanly() -> None:
    """SIGTERM and SIGINT (even when started in the background, where SIGINT is ignored) unwind
    like Ctrl-C: the running tests are stopped and the mutated module restored in the copy."""
    import signal

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/mutate", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seed", type=int, help="sample seed (default: a fresh one, printed)")
    ap.add_argument("--per-module", type=int, default=4, help="mutants per module (default %(default)s)")
    ap.add_argument("--safety", type=int, default=12, help="mutants per safety module (default %(default)s)")
    ap.add_argument(
        "--only", action="append", default=[], help="modules (or --hand/--claims ids) with this prefix"
    )
    ap.add_argument("--hand", action="store_true", help="run bench/mutants.tsv (hand mutants) instead")
    ap.add_argument("--claims", action="store_true", help="re-check bench/equivalent.tsv on the whole suite")
    ap.add_argument("--full", action="store_true", help="whole suite for every mutant (no coverage subsets)")
    ap.add_argument("--no-confirm", action="store_true", help="do not re-run survivors on the whole suite")
    ap.add_argument(
        "--module-subset",
        action="store_true",
        help="a module-level line runs the tests reaching its module, not the whole suite (time-boxed runs)",
    )
    ap.add_argument("--resume", action="store_true", help="skip the mutants --log already has a result for")
    ap.add_argument(
        "--drop-failing", action="store_true", help="leave out tests that fail on the unmutated copy (listed)"
    )
    ap.add_argument(
        "--with-deb", action="store_true", help="include the test that installs the .deb on the host"
    )
    ap.add_argument("--tests", nargs="*", default=[], help="limit the suite to these paths (smoke runs)")
    ap.add_argument("--minutes", type=float, default=0, help="start no mutant after this many minutes")
    ap.add_argument("--confirm-minutes", type=float, default=1e9, help="time for re-running survivors")
    ap.add_argument("--workdir", type=Path, help="keep the copy, venv and coverage here (reused if present)")
    ap.add_argument("--log", type=Path, help="one TSV line per result (default: <workdir>/results.tsv)")
    ap.add_argument(
        "--report", type=Path, action="append", metavar="LOG", help="re-render the report of results logs"
    )
    ap.add_argument("--header", default="", help="with --report: the run's description line")
    ap.add_argument(
        "--no-doc", action="store_true", help="print the report instead of writing docs/testing.md"
    )
    args = ap.parse_args(argv)

    if args.report:
        merged = {r.mutant.ident: r for log in args.report for r in read_log(log)}  # later logs win
        text = report(list(merged.values()), [args.header], read_claims())
        print(text)
        if not args.no_doc:
            write_doc(text)
        return 0
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    _stop_cleanly()
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="odh-mutate-"))
    box = Sandbox(work)
    if not box.tree.exists():
        box.create()
        (work / "commit").write_text(_commit())
    box.check_install()
    # The mutants come from the copy, the tree the tests run (a reused --workdir may be older).
    commit = (work / "commit").read_text().strip() if (work / "commit").exists() else "unrecorded"
    if args.claims:
        mutants, source = claim_mutants(), "the claims in `bench/equivalent.tsv`"
    elif args.hand:
        mutants, source = read_tsv(HAND), "`bench/mutants.tsv` (hand mutants)"
    else:
        mutants = sample(box.tree, seed, args.per_module, args.safety, args.only)
        share = f"{args.safety} per safety module, {args.per_module} per other module"
        source = f"a fresh sample, seed {seed} ({share})"
    if args.only and (args.hand or args.claims):
        mutants = [
            m for m in mutants if any(m.ident.startswith(p) or m.module.startswith(p) for p in args.only)
        ]
    print(f"bench/mutate: {len(mutants)} mutants from {source}, copy of {commit}", flush=True)
    marks = ([] if args.with_deb else NOT_DEB) + list(args.tests)
    log = args.log or work / "results.tsv"
    full_mode = args.full or args.claims
    cache = work / "coverage.json"
    runner = Runner(box, marks, 0.0, args.module_subset)
    if full_mode:
        base = box.pytest(marks, 4 * 3600)
        if base.rc != 0:
            raise SystemExit(f"bench/mutate: the unmutated copy fails its tests:\n{base.tail}")
        runner.full_seconds = base.seconds
    else:
        if cache.exists():
            data = json.loads(cache.read_text())
            runner.cover = {m: {int(k): v for k, v in ls.items()} for m, ls in data["cover"].items()}
            runner.durations = data["durations"]
        else:
            runner.cover, runner.durations = collect_coverage(box, marks, args.drop_failing)
            cache.write_text(json.dumps({"cover": runner.cover, "durations": runner.durations}))
        runner.full_seconds = sum(runner.durations.values())
    print(f"bench/mutate: whole suite ~{runner.full_seconds / 60:.1f} min unmeasured", flush=True)

    canary = runner.run(CANARY, full=False)
    _write_log(log, canary)
    print(f"canary {canary.status} by {canary.killer} ({canary.how}, {canary.tests} tests)", flush=True)
    if canary.status != "killed":
        raise SystemExit("bench/mutate: the canary survived: the tests do not run the copy's install")

    results: list[Result] = [canary]
    if args.resume and log.exists():
        done = {r.mutant.ident: r for r in read_log(log) if r.mutant.origin != "canary"}
        results += [done[m.ident] for m in mutants if m.ident in done]
        mutants = [m for m in mutants if m.ident not in done]
    claims = read_claims()
    deadline = started + args.minutes * 60 if args.minutes else None
    skipped = 0
    if args.minutes:
        mutants = interleave(mutants)
    for i, m in enumerate(mutants, 1):
        if deadline is not None and time.monotonic() > deadline:
            skipped = len(mutants) - i + 1
            break
        r = runner.run(m, full=full_mode)
        results.append(r)
        _write_log(log, r)
        print(
            f"[{i}/{len(mutants)}] {r.status:8} {r.seconds:6.1f}s {r.how:11} {r.tests:4} "
            f"{m.ident} {m.module}:{r.lineno} {r.killer}",
            flush=True,
        )
    # Survivors of a subset run again on the whole suite (a test the coverage run missed, e.g.
    # a ``python -S`` child, could still kill them), while --confirm-minutes allow.
    confirm_end = time.monotonic() + args.confirm_minutes * 60
    for n, r in enumerate(results):
        if r.status != "survived" or r.how != "subset" or args.no_confirm or time.monotonic() > confirm_end:
            continue
        again = runner.run(r.mutant, full=True)
        results[n] = replace(again, how="subset+full", tests=r.tests)
        _write_log(log, results[n])
        print(f"confirm {again.status:8} {again.seconds:6.1f}s {r.mutant.ident} {again.killer}", flush=True)

    ran = len(results) - 1
    header = [
        f"Run: {when}, commit {commit}, {source}; {ran} of {len(mutants)} mutants run"
        + (f" ({skipped} not started: the --minutes limit)" if skipped else "")
        + f", {(time.monotonic() - started) / 60:.0f} min. Each mutant ran in an installed copy "
        f"({'the whole suite' if full_mode else 'its coverage subset, survivors again on the whole suite'}"
        f"{', without the .deb install test' if marks else ''}). Canary (`hook/__main__.py` exits 97): "
        f"{canary.status} by `{canary.killer}`.",
    ]
    text = report(results, header, claims)
    print(text)
    if not (args.no_doc or args.hand or args.claims):
        write_doc(text)
        print(f"bench/mutate: wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
