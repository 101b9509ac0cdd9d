"""Fresh one-line mutants of ``hook/``, sampled with a recorded seed.

Rule: the published score is measured on mutants nobody wrote tests against. Every run draws a
new sample (``random.Random(seed)``, the seed printed and written to the report) from all AST
candidates of every module, the safety modules first, so the same seed on the same commit gives
the same mutants and a new seed gives new ones.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# The modules whose failure lets a container reach a device it should not, or writes outside
# it (issue 24): run first, and given a larger share of the sample.
SAFETY = (
    "hook/core/hostdev.py",
    "hook/adapters/allowlist.py",
    "hook/adapters/marker.py",
    "hook/sources/kubelet/checkpoint.py",  # kubelet evidence: the device plugins' checkpoint
    "hook/sources/kubelet/dra.py",  # kubelet evidence: DRA claims
    "hook/sources/kubelet/podid.py",  # the pod identity
    "hook/sources/cachefile.py",
    "hook/entry.py",
    "hook/routes/fastpath.py",  # entry's fast path, split out of it
    "hook/sources/privatefile.py",  # the fast path's trust-checked reads, split out of it
    "hook/core/requests.py",
    "hook/core/asks.py",
    "hook/core/kubeasks.py",
    "hook/core/accel.py",
    "hook/core/decide.py",
    "hook/core/rules.py",
    "hook/core/kpath.py",  # kernel paths: how the kernel and the runtimes resolve a container path
    "hook/adapters/apply/",
    "hook/routes/precreate.py",
    "hook/adapters/specwriter.py",
    "hook/routes/runtimeargs",  # the runtime command-line reading (and the modules split from it)
    "hook/routes/serve",  # the decider (and the modules split from it)
    "hook/routes/answer.py",  # the decider's side of one request: the MAC check, the fingerprint
    "hook/routes/wire.py",  # the node key and the MACs that bind requests and answers
    "hook/routes/client",  # the decider's client
    "hook/routes/offer.py",  # the hook's side: when it asks, what an answer may become
    "hook/routes/act.py",  # the one apply-and-log path, for both deciders
    "hook/tools/nodefs.py",  # the installer's file writes (inside --root, whole writes)
)



@dataclass(frozen=True, slots=True)
class Mutant:
    ident: str
    module: str
    occurrence: int  # 1 = first line of the module with exactly this stripped text
    line: str
    new: str
    origin: str  # operator name, "hand" or "canary"

    def row(self) -> str:
        return "\t".join([self.ident, self.module, str(self.occurrence), self.line, self.new, self.origin])


def _matches(module: str, entry: str) -> bool:
    """An entry names a module, a folder (``/`` at the end) or a module stem (no ``.py``: the module
    and those split from it, e.g. ``hook/routes/serve`` also names ``hook/routes/serve_wire.py``)."""
    if entry.endswith("/"):
        return module.startswith(entry)
    return module == entry or (not entry.endswith(".py") and module.startswith(entry))


def is_safety(module: str) -> bool:
    return any(_matches(module, s) for s in SAFETY)


def modules(root: Path) -> list[str]:
    """Every module of hook/ that has code, the safety modules first (in SAFETY's order)."""
    found = sorted(str(p.relative_to(root)) for p in (root / "hook").rglob("*.py"))

    def rank(m: str) -> tuple[int, str]:
        for i, s in enumerate(SAFETY):
            if _matches(m, s):
                return i, m
        return len(SAFETY), m

    return sorted(found, key=rank)


# --- candidates ---------------------------------------------------------------------------------

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
    """ids of nodes never mutated: docstrings, annotations, f-strings, imports, __all__.

    ``if TYPE_CHECKING:`` blocks are mutated like any code: a typing-only import that runs at
    start-up is a regression the import-budget tests catch (issue 24, g159).
    """
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
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    )


def _droppable(node: ast.AST) -> bool:
    """Statements whose removal is a behaviour change, not a NameError: calls, updates, jumps."""
    if isinstance(node, ast.Expr):
        return not isinstance(node.value, ast.Constant)
    if isinstance(node, ast.Assign):
        return all(isinstance(t, ast.Attribute | ast.Subscript) for t in node.targets)
    return isinstance(node, ast.AugAssign | ast.Continue | ast.Break | ast.Raise | ast.Return)


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


def candidates(module: str, source: str) -> list[Mutant]:
    """Every one-line mutant of ``source``, in line order (``compiles`` checks one)."""
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
        out.append(Mutant("", module, occurrence, line, new, op))
    return out


def compiles(source: str, m: Mutant) -> bool:
    applied = apply(source, m)
    if applied is None:
        return False
    try:
        compile(applied[0], m.module, "exec")
    except SyntaxError:
        return False
    return True


def reindent(original: str, new: str) -> str:
    return original[: len(original) - len(original.lstrip())] + new


def sample(
    root: Path, seed: int, per_module: int, safety_per_module: int, only: Sequence[str] = ()
) -> list[Mutant]:
    """``per_module`` random candidates of each module (``safety_per_module`` for the safety
    ones), drawn with ``random.Random(f"{seed}:{module}")``: adding a module does not change
    another module's draw. Ids are ``s<seed>-<n>`` in run order (safety modules first) over the
    whole sample, so ``only`` (module prefixes) picks a part without renumbering it."""
    out: list[Mutant] = []
    for module in modules(root):
        source = (root / module).read_text()
        cands = candidates(module, source)
        k = safety_per_module if is_safety(module) else per_module
        order = random.Random(f"{seed}:{module}").sample(range(len(cands)), len(cands))
        picked: list[int] = []
        for i in order:
            if len(picked) == k:
                break
            if compiles(source, cands[i]):
                picked.append(i)
        out += [cands[i] for i in sorted(picked)]
    numbered = [
        Mutant(f"s{seed}-{i:03d}", m.module, m.occurrence, m.line, m.new, m.origin)
        for i, m in enumerate(out, 1)
    ]
    return [m for m in numbered if not only or any(m.module.startswith(p) for p in only)]


def apply(source: str, m: Mutant) -> tuple[str, int] | None:
    """The module text with the mutant applied and its line number, or None when the line is gone."""
    lines = source.split("\n")
    seen = 0
    for n, line in enumerate(lines):
        if line.strip() == m.line:
            seen += 1
            if seen == m.occurrence:
                lines[n] = reindent(line, m.new)
                return "\n".join(lines), n + 1
    return None


def read_tsv(path: Path) -> list[Mutant]:
    out = []
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        ident, module, occurrence, line, new, origin = raw.split("\t")[:6]
        out.append(Mutant(ident, module, int(occurrence), line, new, origin))
    return out
