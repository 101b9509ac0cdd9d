"""bench/mutate: one-line mutants of the core, each run against the tests that should catch it.

Rule: the real tree is never mutated. The tree is copied once per worker into a temp dir; a
mutant is one line of one module, found by its exact text (stripped) and occurrence number, so
the data file survives edits elsewhere in the module (a line that no longer exists is reported
"stale", not guessed). Each mutant runs only its module's test subset (``TESTS``), ``-x``, with
a timeout; a run that fails or times out kills it, one that passes lets it survive.

``generate`` builds the broad set from the modules' AST (comparison and boolean flips, negated
conditions, off-by-one constants, dropped statements), sampled deterministically by hash;
``bench/mutants.tsv`` holds that set plus hand-written mutants (``hand``: the survivors of the
first trial in issue 17, each pinned by a test since). Results go to ``docs/testing.md`` between
the ``mutation`` markers.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import datetime
import hashlib
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench" / "mutants.tsv"
DOC = REPO / "docs" / "testing.md"
BEGIN, END = "<!-- mutation:begin -->", "<!-- mutation:end -->"

# The modules issue 17 targets (>= 90 %), and the tests that are meant to pin each of them,
# most specific first (-x stops at the first failure, so a killed mutant costs little).
_DECIDE = ["tests/test_topologies.py", "tests/test_decide.py"]
TESTS: dict[str, list[str]] = {
    "hook/decide.py": ["tests/test_survivors.py", *_DECIDE],
    "hook/requests.py": ["tests/test_requests.py", "tests/test_survivors.py", *_DECIDE],
    "hook/rules.py": ["tests/test_rules.py", "tests/test_oci.py", "tests/apply", *_DECIDE],
    "hook/apply/": ["tests/apply"],
    "hook/cdi/registry.py": ["tests/cdi", *_DECIDE],
    "hook/cdi/edits.py": ["tests/cdi", "tests/test_topologies.py"],
    "hook/cdi/hostnodes.py": ["tests/cdi", "tests/test_topologies.py"],
    "hook/gather.py": ["tests/test_gather.py", *_DECIDE],
    "hook/settings.py": ["tests/test_settings.py", "tests/test_decide.py"],
    "hook/nvidia/": ["tests/nvidia", "tests/test_survivors.py", "tests/test_topologies.py"],
    "hook/entry.py": [
        "tests/test_fastpath.py",
        "tests/test_survivors.py",
        "tests/test_fastpath_settings.py",
        "tests/test_cli.py",
    ],
    "hook/fastpath.py": [
        "tests/test_fastpath.py",
        "tests/test_survivors.py",
        "tests/test_fastpath_settings.py",
        "tests/test_cachefile.py",
    ],
}
TARGETS = [
    "hook/decide.py",
    "hook/requests.py",
    "hook/rules.py",
    *(f"hook/apply/{m}.py" for m in ("bpf", "bpf_sys", "cgroup_v1", "cgroup_v2", "devnodes", "locate")),
    "hook/apply/transaction.py",
    "hook/cdi/registry.py",
    "hook/cdi/edits.py",
    *(
        f"hook/nvidia/{m}.py"
        for m in ("commands", "hostcheck", "ids", "inventory", "migminors", "model", "nodes", "nvml")
    ),
    "hook/nvidia/procfs.py",
    "hook/nvidia/snapshot.py",
    "hook/entry.py",
    "hook/fastpath.py",
]
_IGNORE = shutil.ignore_patterns(
    ".venv", ".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "*.egg-info"
)


@dataclass(frozen=True, slots=True)
class Mutant:
    ident: str
    module: str
    occurrence: int  # 1 = first line of the module with exactly this stripped text
    line: str
    new: str
    origin: str  # operator name, or "hand"

    def row(self) -> str:
        return "\t".join([self.ident, self.module, str(self.occurrence), self.line, self.new, self.origin])


def tests_for(module: str) -> list[str]:
    key = module if module in TESTS else next(k for k in TESTS if k.endswith("/") and module.startswith(k))
    return TESTS[key]


# --- generation ---------------------------------------------------------------------------------

_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_EDGE: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.Gt: ast.GtE,
    ast.LtE: ast.Lt,
    ast.GtE: ast.Gt,
}
_BINOP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.BitOr: ast.BitAnd,
    ast.BitAnd: ast.BitOr,
}


def _skip_nodes(tree: ast.Module) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, f-strings, __all__, TYPE_CHECKING blocks."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                mark(body[0])
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            mark(node.returns)
            for d in node.decorator_list:
                mark(d)
        elif isinstance(node, ast.ClassDef):
            for d in [*node.decorator_list, *node.bases]:
                mark(d)
        elif isinstance(node, ast.arg | ast.AnnAssign):
            mark(node.annotation)
        elif _never_mutated(node):
            mark(node)
    return skip


def _never_mutated(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr | ast.Import | ast.ImportFrom):
        return True
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _droppable(node: ast.AST) -> bool:
    """Statements whose removal is a behaviour change, not a NameError: calls, updates, jumps."""
    if isinstance(node, ast.Expr):
        return not isinstance(node.value, ast.Constant)
    if isinstance(node, ast.Assign):
        return all(isinstance(t, ast.Attribute | ast.Subscript) for t in node.targets)
    return isinstance(node, ast.AugAssign | ast.Continue | ast.Break | ast.Raise)


def _expr_mutations(node: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        op = type(node.ops[0])
        if op in _FLIP:
            yield "flip-compare", ast.Compare(node.left, [_FLIP[op]()], node.comparators)
        if op in _EDGE:
            yield "edge-compare", ast.Compare(node.left, [_EDGE[op]()], node.comparators)
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield "flip-bool", ast.BoolOp(other, node.values)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "drop-not", node.operand
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield "flip-constant", ast.Constant(not node.value)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield "off-by-one", ast.Constant(node.value + 1)
        if node.value:
            yield "off-by-one", ast.Constant(node.value - 1)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
        yield "swap-operator", ast.BinOp(node.left, _BINOP[type(node.op)](), node.right)


def _candidates(module: str, source: str) -> list[Mutant]:
    tree = ast.parse(source)
    skip = _skip_nodes(tree)
    lines = source.splitlines()
    found: dict[tuple[int, str], str] = {}
    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "lineno") or node.lineno != node.end_lineno:
            continue
        n = node.lineno - 1
        raw = lines[n].encode()
        start, end = node.col_offset, node.end_col_offset
        assert end is not None
        if isinstance(node, ast.If | ast.While) and node.test.lineno == node.test.end_lineno:
            t = node.test
            seg = raw[t.col_offset : t.end_col_offset].decode()
            new = raw[: t.col_offset].decode() + f"not ({seg})" + raw[t.end_col_offset :].decode()
            found.setdefault((n, new.strip()), "negate-condition")
        whole_line = raw[:start].strip() == b"" and raw[end:].strip() in (b"", b";")
        if _droppable(node) and whole_line:
            found.setdefault((n, "pass"), "drop-statement")
        if isinstance(node, ast.expr):
            for op, replacement in _expr_mutations(node):
                text = raw[:start].decode() + "(" + ast.unparse(replacement) + ")" + raw[end:].decode()
                found.setdefault((n, text.strip()), op)
    out = []
    for (n, new), op in sorted(found.items()):
        line = lines[n].strip()
        if new == line or "\t" in line or "\t" in new or line.startswith(("def ", "class ", "@")):
            continue
        occurrence = sum(1 for other in lines[: n + 1] if other.strip() == line)
        try:
            compile("\n".join([*lines[:n], _reindent(lines[n], new), *lines[n + 1 :]]), module, "exec")
        except SyntaxError:
            continue
        out.append(Mutant("", module, occurrence, line, new, op))
    return out


def _reindent(original: str, new: str) -> str:
    return original[: len(original) - len(original.lstrip())] + new


def _hash(m: Mutant) -> str:
    return hashlib.sha256(f"{m.module}\0{m.line}\0{m.new}".encode()).hexdigest()


def generate(root: Path, total: int) -> list[Mutant]:
    """About ``total`` mutants over TARGETS; a module's share grows with the square root of its
    candidate count (min 4), so the eBPF builder's many constants do not crowd out the policy."""
    per = {m: _candidates(m, (root / m).read_text()) for m in TARGETS}
    weight = sum(math.sqrt(len(c)) for c in per.values())
    out: list[Mutant] = []
    for cands in per.values():
        quota = min(len(cands), max(4, round(total * math.sqrt(len(cands)) / weight)))
        out += sorted(cands, key=_hash)[:quota]
    return out


# --- the data file ---------------------------------------------------------------------------------


def read_data(path: Path) -> list[Mutant]:
    out = []
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        ident, module, occurrence, line, new, origin = raw.split("\t")
        out.append(Mutant(ident, module, int(occurrence), line, new, origin))
    return out


def write_data(path: Path, notes: Sequence[str], hand: Sequence[Mutant], generated: Sequence[Mutant]) -> None:
    rows = [
        "# bench/mutate's mutants: id, module, occurrence, original line (stripped), mutated line, origin.",
        "# One tab between fields. 'hand' rows are kept across regeneration (bench/mutate --generate N).",
        *notes,
    ]
    rows += [m.row() for m in hand]
    rows += [
        Mutant(f"g{i:03d}", m.module, m.occurrence, m.line, m.new, m.origin).row()
        for i, m in enumerate(generated, 1)
    ]
    path.write_text("\n".join(rows) + "\n")


# --- running ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Result:
    mutant: Mutant
    status: str  # killed | survived | timeout | stale | invalid
    seconds: float
    lineno: int = 0
    killer: str = ""  # the test file that failed first


def apply(source: str, m: Mutant) -> tuple[str, int] | None:
    """The module text with the mutant applied and its line number, or None when the line is gone."""
    lines = source.split("\n")
    seen = 0
    for n, line in enumerate(lines):
        if line.strip() == m.line:
            seen += 1
            if seen == m.occurrence:
                lines[n] = _reindent(line, m.new)
                return "\n".join(lines), n + 1
    return None


def _pytest(copy: Path, tests: Sequence[str], timeout: float) -> tuple[int, float, str]:
    """Exit status (-1: timeout), seconds, and the test file that failed first ("" if none)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(copy),
        "PATH": f"{REPO / '.venv/bin'}:{os.environ.get('PATH', '')}",
    }
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider"]
    cmd += ["--ignore=tests/live", *tests]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, timeout=timeout, check=False)
        rc, out = proc.returncode, proc.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired:
        rc, out = -1, ""
    killer = next(
        (
            line.split()[1].split("::")[0]
            for line in out.splitlines()
            if line.startswith(("FAILED ", "ERROR ")) and len(line.split()) > 1
        ),
        "",
    )
    return rc, time.monotonic() - start, killer


def _existing(copy: Path, tests: Sequence[str]) -> list[str]:
    """The subset's paths that exist in this tree (an older tree may lack a newer test file)."""
    return [t for t in tests if (copy / t).exists()]


_STAMPS = itertools.count()


def _first(tests: Sequence[str], killer: str) -> list[str]:
    """``tests`` with the file that killed this mutant last time run first (same subset, new order)."""
    if not killer or not any(killer == t or killer.startswith(t.rstrip("/") + "/") for t in tests):
        return list(tests)
    return [killer, *(t for t in tests if t != killer)]


def run_one(copy: Path, m: Mutant, timeout: float, killer: str = "") -> Result:
    path = copy / m.module
    original = path.read_text()
    applied = apply(original, m)
    if applied is None:
        return Result(m, "stale", 0.0)
    text, lineno = applied
    try:
        compile(text, m.module, "exec")
    except SyntaxError:
        return Result(m, "invalid", 0.0, lineno)
    # Bytecode stays cached: the mutated file gets an mtime of its own (a stale .pyc of another
    # mutant can never match it), the restored one its original mtime (its .pyc stays valid).
    mtime = path.stat().st_mtime_ns
    try:
        path.write_text(text)
        stamp = mtime + (next(_STAMPS) * 1000 + 1000) * 1_000_000_000
        os.utime(path, ns=(stamp, stamp))
        rc, secs, first = _pytest(copy, _first(_existing(copy, tests_for(m.module)), killer), timeout)
    finally:
        path.write_text(original)
        os.utime(path, ns=(mtime, mtime))
    status = "timeout" if rc == -1 else "survived" if rc == 0 else "killed"
    if rc in (4, 5):  # usage error or nothing collected: the subset is broken, not the mutant killed
        status = "invalid"
    return Result(m, status, secs, lineno, first)


def _copy_tree(dest: Path) -> Path:
    shutil.copytree(REPO, dest, ignore=_IGNORE, symlinks=True)
    return dest


def baseline(copies: Sequence[Path], modules: Sequence[str]) -> dict[str, float]:
    """Each needed subset must pass unmutated (one per worker at a time); its time sets the
    mutants' timeout. This also compiles every copy's bytecode once."""
    keys = sorted({tuple(tests_for(m)) for m in modules})
    free = list(copies)

    def one(key: tuple[str, ...]) -> float:
        copy = free.pop()
        try:
            rc, secs, _ = _pytest(copy, _existing(copy, key), 900)
        finally:
            free.append(copy)
        if rc != 0:
            raise SystemExit(f"bench/mutate: the unmutated tests fail ({' '.join(key)}): fix them first")
        return secs

    with concurrent.futures.ThreadPoolExecutor(len(copies)) as pool:
        took = dict(zip(keys, pool.map(one, keys), strict=True))
    return {m: took[tuple(tests_for(m))] for m in modules}


def _load_history(path: Path | None) -> dict[str, str]:
    try:
        return dict(json.loads(path.read_text())) if path else {}
    except (OSError, ValueError):
        return {}


def run_all(
    mutants: Sequence[Mutant], jobs: int, log: Path | None, history: Path | None = None
) -> list[Result]:
    """Run every mutant; ``history`` (mutant key -> killing test file) orders each subset so the
    file that killed a mutant before runs first, and is updated as results come in."""
    killers = _load_history(history)
    with tempfile.TemporaryDirectory(prefix="odh-mutate-") as tmp:
        copies = [_copy_tree(Path(tmp) / f"w{i}") for i in range(jobs)]
        base = baseline(copies, sorted({m.module for m in mutants}))
        free = list(copies)
        results: list[Result] = []

        def task(m: Mutant) -> Result:
            copy = free.pop()
            try:
                return run_one(copy, m, max(60.0, 4 * base[m.module]), killers.get(_hash(m), ""))
            finally:
                free.append(copy)

        with (
            concurrent.futures.ThreadPoolExecutor(jobs) as pool,
            open(log, "a") if log else contextlib.nullcontext() as out,
        ):
            for i, r in enumerate(pool.map(task, mutants), 1):
                results.append(r)
                if history is not None and r.killer:
                    killers[_hash(r.mutant)] = r.killer
                    history.write_text(json.dumps(killers, sort_keys=True, indent=0))
                where = f"{r.mutant.ident} {r.mutant.module}:{r.lineno}"
                line = f"[{i}/{len(mutants)}] {r.status:8} {r.seconds:5.1f}s {where} {r.killer}"
                print(line, flush=True)
                if out is not None:
                    out.write(line + "\n")
                    out.flush()
        return results


# --- report ---------------------------------------------------------------------------------------


def _group(module: str) -> str:
    for prefix in ("hook/apply/", "hook/nvidia/"):
        if module.startswith(prefix):
            return prefix + "*"
    return module


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip()

    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    return git("rev-parse", "--short", "HEAD") + dirty


def report(results: Sequence[Result], seconds: float, jobs: int) -> str:
    counted = [r for r in results if r.status in ("killed", "survived", "timeout")]
    groups: dict[str, list[Result]] = {}
    for r in counted:
        groups.setdefault(_group(r.mutant.module), []).append(r)

    def score(rs: Sequence[Result]) -> str:
        killed = sum(r.status != "survived" for r in rs)
        return f"{killed} | {len(rs) - killed} | {100 * killed / len(rs):.1f} %" if rs else "0 | 0 | -"

    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    n = {s: sum(r.status == s for r in results) for s in ("timeout", "stale", "invalid")}
    lines = [
        BEGIN,
        f"Run: {when}, commit {_commit()}, {len(results)} mutants from `bench/mutants.tsv`, "
        f"{jobs} worker(s), {seconds / 60:.1f} min. Killed includes {n['timeout']} timeout(s); "
        f"{n['stale']} stale and {n['invalid']} invalid mutant(s) are not counted.",
        "",
        "| module | mutants | killed | survived | score |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in sorted(groups):
        lines.append(f"| `{name}` | {len(groups[name])} | {score(groups[name])} |")
    lines.append(f"| **all** | {len(counted)} | {score(counted)} |")
    survivors = [r for r in results if r.status == "survived"]
    lines += ["", f"Survivors ({len(survivors)}):", ""]
    lines += [
        f"- `{r.mutant.ident}` `{r.mutant.module}:{r.lineno}` ({r.mutant.origin}): "
        f"`{r.mutant.line}` → `{r.mutant.new}`"
        for r in survivors
    ] or ["- none"]
    stale = [r for r in results if r.status in ("stale", "invalid")]
    if stale:
        lines += ["", "Not counted: " + ", ".join(f"`{r.mutant.ident}` ({r.status})" for r in stale)]
    lines.append(END)
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text() if DOC.exists() else f"# Testing\n\n{BEGIN}\n{END}\n"
    if BEGIN not in doc:
        doc += f"\n{BEGIN}\n{END}\n"
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(head + text + tail)


def _selected(m: Mutant, prefix: str) -> bool:
    """``--only h`` picks the hand mutants, ``--only hook/nvidia/`` a package's."""
    return m.ident.startswith(prefix) or ("/" in prefix and m.module.startswith(prefix))


def _exit_on_term() -> None:
    """SIGTERM unwinds like Ctrl-C, so the temp copies are removed when a run is stopped."""
    import signal

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/mutate", description=__doc__.splitlines()[0])
    ap.add_argument("--generate", type=int, metavar="N", help="rewrite bench/mutants.tsv with ~N AST mutants")
    ap.add_argument(
        "--only", action="append", default=[], help="run mutants whose id or module has this prefix"
    )
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--log", type=Path, help="append one line per mutant here as it finishes")
    ap.add_argument(
        "--history",
        type=Path,
        default=Path(tempfile.gettempdir()) / "odh-mutate-history.json",
        help="which test file killed each mutant last time: run it first (default: %(default)s)",
    )
    ap.add_argument(
        "--no-doc", action="store_true", help="print the report instead of writing docs/testing.md"
    )
    args = ap.parse_args(argv)
    if args.generate:
        old = DATA.read_text().splitlines() if DATA.exists() else []
        notes = [line for line in old[2:] if line.startswith("#")]
        hand = [m for m in read_data(DATA) if m.origin == "hand"] if DATA.exists() else []
        write_data(DATA, notes, hand, generate(REPO, args.generate))
        print(f"bench/mutate: wrote {DATA.relative_to(REPO)}")
        return 0
    mutants = read_data(DATA)
    if args.only:
        mutants = [
            m for m in mutants if any(m.ident.startswith(p) or m.module.startswith(p) for p in args.only)
        ]
    _exit_on_term()
    start = time.monotonic()
    results = run_all(mutants, max(1, args.jobs), args.log, args.history)
    text = report(results, time.monotonic() - start, args.jobs)
    if args.no_doc or args.only:
        print(text)
    else:
        write_doc(text)
        print(f"bench/mutate: wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
