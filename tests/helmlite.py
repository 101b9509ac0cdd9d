"""A small renderer for the subset of Helm's Go templates the chart uses (``helm`` cannot be
installed on this project's machines: no package of the registries they reach ships it).

What it implements, as Go's text/template and Helm's functions define it: text and ``{{ }}``
actions with ``{{-``/``-}}`` trimming, ``/* */`` comments, pipelines (``a | f b`` is ``f b a``),
field chains on ``.``, ``$`` and ``$var`` (a missing map key is nil; a field of nil is an error, as
in Go), string/number/bool literals and parenthesised pipelines, ``if``/``else if``/``else``,
``with``/``else``, ``range`` (with ``$i, $v :=``), ``$v :=`` and ``$v =``, and the functions
``default quote toYaml nindent indent required fail printf eq ne not and or empty hasKey
hasPrefix trimPrefix toString list add1``. Go's truth: false, 0, nil, "" and empty collections are
false. Anything else is an error, so a template using more than this fails its test instead of
rendering wrongly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\(|\)|\||:=|=|,|[^\s()|,]+)')


class TemplateError(Exception):
    pass


class Files:
    def __init__(self, root: Path) -> None:
        self.root = root

    def Get(self, name: str) -> str:  # Helm's name
        return (self.root / name).read_text()


def truth(v: Any) -> bool:
    return not (v is None or v is False or (v == 0 and not isinstance(v, bool)) or v in ("", [], {}))


def _indent(n: int, s: str) -> str:
    pad = " " * n
    return pad + str(s).replace("\n", "\n" + pad)


def _to_yaml(v: Any) -> str:
    return "" if v is None else yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n")


def _required(msg: str, v: Any) -> Any:
    if v is None or v == "":
        raise TemplateError(msg)
    return v


def _fail(msg: str) -> Any:
    raise TemplateError(msg)


def _and(*a: Any) -> Any:
    for v in a:
        if not truth(v):
            return v
    return a[-1]


def _or(*a: Any) -> Any:
    for v in a:
        if truth(v):
            return v
    return a[-1]


FUNCS: dict[str, Callable[..., Any]] = {
    "default": lambda d, v=None: v if truth(v) else d,
    "quote": lambda *a: " ".join(json.dumps(str(v)) for v in a if v is not None),
    "toYaml": _to_yaml,
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "indent": _indent,
    "required": _required,
    "fail": _fail,
    "printf": lambda f, *a: f.replace("%v", "%s") % a,
    "eq": lambda a, *b: any(a == x for x in b),
    "ne": lambda a, b: a != b,
    "not": lambda v: not truth(v),
    "and": _and,
    "or": _or,
    "empty": lambda v: not truth(v),
    "hasKey": lambda d, k: k in d,
    "hasPrefix": lambda s, p: str(p).startswith(s),
    "trimPrefix": lambda p, s: s[len(p) :] if s.startswith(p) else s,
    "toString": lambda v: _show(v),
    "list": lambda *a: list(a),
    "add1": lambda v: int(v) + 1,
}


def _show(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, dict | list):
        raise TemplateError(f"printing a collection ({v!r}): use toYaml")
    return str(v)


def _parse(text: str) -> list[Any]:
    """Nodes: str, ("out", expr), ("set", expr), ("if"|"with"|"range", expr, body, else_body)."""
    tokens: list[Any] = []
    pos = 0
    for m in ACTION.finditer(text):
        tokens.append(text[pos : m.start()])
        tokens.append((m.group(1) is not None, m.group(2).strip(), m.group(3) is not None))
        pos = m.end()
    tokens.append(text[pos:])
    for i, t in enumerate(tokens):  # trimming
        if isinstance(t, tuple):
            if t[0]:
                tokens[i - 1] = tokens[i - 1].rstrip()
            if t[2]:
                tokens[i + 1] = tokens[i + 1].lstrip()
    root: list[Any] = []
    stack: list[tuple[list[Any], Any]] = [(root, None)]
    for t in tokens:
        body = stack[-1][0]
        if isinstance(t, str):
            if t:
                body.append(t)
            continue
        src = t[1]
        if src.startswith("/*"):
            continue
        word, _, rest = src.partition(" ")
        if word in ("if", "with", "range"):
            node = [word, rest.strip(), [], None]
            body.append(node)
            stack.append((node[2], node))
        elif word == "else":
            node = stack[-1][1]
            node[3] = []
            stack[-1] = (node[3], node)
            rest = rest.strip()
            if rest.startswith("if "):  # else if: a nested if in the else branch, closed by the same end
                inner = ["if", rest[3:].strip(), [], None, "chained"]
                node[3].append(inner)
                stack.append((inner[2], inner))
        elif word == "end":
            while True:
                _, node = stack.pop()
                if len(node) < 5:
                    break
        else:
            body.append(["out", src])
    if len(stack) != 1:
        raise TemplateError("unclosed action")
    return root


class Scope:
    def __init__(self, dot: Any, root: Any, parent: Scope | None = None) -> None:
        self.dot, self.root, self.vars, self.parent = dot, root, {}, parent

    def get(self, name: str) -> Any:
        s: Scope | None = self
        while s is not None:
            if name in s.vars:
                return s.vars[name]
            s = s.parent
        raise TemplateError(f"undefined variable {name}")

    def assign(self, name: str, value: Any) -> None:
        s: Scope | None = self
        while s is not None:
            if name in s.vars:
                s.vars[name] = value
                return
            s = s.parent
        raise TemplateError(f"assignment to undeclared {name}")


def _field(v: Any, name: str) -> Any:
    if v is None:
        raise TemplateError(f"nil pointer evaluating .{name}")
    if isinstance(v, dict):
        return v.get(name)
    if hasattr(v, name):
        return getattr(v, name)
    raise TemplateError(f"can't evaluate field {name} in {type(v).__name__}")


def _chain(base: Any, fields: str) -> Any:
    for f in [f for f in fields.split(".") if f]:
        base = _field(base, f)
    return base


def _value(tok: Any, scope: Scope) -> Any:
    if isinstance(tok, list):
        return _pipeline(tok, scope)
    if tok.startswith('"'):
        return json.loads(tok)
    if tok in ("true", "false"):
        return tok == "true"
    if tok == "nil":
        return None
    if re.fullmatch(r"-?\d+", tok):
        return int(tok)
    if tok == ".":
        return scope.dot
    if tok.startswith("."):
        return _chain(scope.dot, tok)
    if tok.startswith("$"):
        name, _, rest = tok.partition(".")
        return _chain(scope.root if name == "$" else scope.get(name), rest)
    raise TemplateError(f"unknown token {tok!r}")


def _group(tokens: list[str]) -> list[Any]:
    out: list[Any] = []
    stack = [out]
    for t in tokens:
        if t == "(":
            stack[-1].append([])
            stack.append(stack[-1][-1])
        elif t == ")":
            stack.pop()
        else:
            stack[-1].append(t)
    return out


def _pipeline(tokens: list[Any], scope: Scope) -> Any:
    commands: list[list[Any]] = [[]]
    for t in tokens:
        if t == "|":
            commands.append([])
        else:
            commands[-1].append(t)
    result: Any = None
    for i, cmd in enumerate(commands):
        head, args = cmd[0], cmd[1:]
        extra = [result] if i else []
        if isinstance(head, str) and head in FUNCS:
            result = FUNCS[head](*[_value(a, scope) for a in args], *extra)
        elif isinstance(head, str) and re.fullmatch(r"[A-Za-z]\w*", head):
            raise TemplateError(f"function {head!r} not defined (helmlite)")
        else:
            v = _value(head, scope)
            if callable(v):
                v = v(*[_value(a, scope) for a in args], *extra)
            elif args or extra:
                raise TemplateError(f"{head} is not a function")
            result = v
    return result


def _expr(src: str, scope: Scope) -> tuple[list[str], Any]:
    """(declared variable names, value) of ``[$a[, $b] :=|=] pipeline``."""
    tokens = [m.group(1) for m in TOKEN.finditer(src)]
    names: list[str] = []
    if ":=" in tokens or "=" in tokens:
        op = ":=" if ":=" in tokens else "="
        k = tokens.index(op)
        names = [t for t in tokens[:k] if t != ","]
        tokens = tokens[k + 1 :]
        if op == "=":
            names = ["=" + n for n in names]
    return names, _group(tokens)


def _run(nodes: list[Any], scope: Scope, out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, str):
            out.append(node)
        elif node[0] == "out":
            names, tokens = _expr(node[1], scope)
            value = _pipeline(tokens, scope)
            if names and names[0].startswith("="):
                scope.assign(names[0][1:], value)
            elif names:
                scope.vars[names[0]] = value
            else:
                out.append(_show(value))
        elif node[0] in ("if", "with"):
            names, tokens = _expr(node[1], scope)
            value = _pipeline(tokens, scope)
            inner = Scope(value if node[0] == "with" else scope.dot, scope.root, scope)
            if names:
                inner.vars[names[0]] = value
            if truth(value):
                _run(node[2], inner, out)
            elif node[3] is not None:
                _run(node[3], Scope(scope.dot, scope.root, scope), out)
        elif node[0] == "range":
            names, tokens = _expr(node[1], scope)
            value = _pipeline(tokens, scope)
            items = list(value.items()) if isinstance(value, dict) else list(enumerate(value or []))
            for k, v in items:
                inner = Scope(v, scope.root, scope)
                if len(names) == 2:
                    inner.vars[names[0]], inner.vars[names[1]] = k, v
                elif names:
                    inner.vars[names[0]] = v
                _run(node[2], inner, out)
            if not items and node[3] is not None:
                _run(node[3], scope, out)


def render_template(text: str, context: dict[str, Any]) -> str:
    out: list[str] = []
    _run(_parse(text), Scope(context, context), out)
    return "".join(out)


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merge(base.get(k), over[k]) if k in base else over[k] for k in over} | {
            k: v for k, v in base.items() if k not in over
        }
    return over


def render_chart(chart: Path, values: dict[str, Any] | None = None, namespace: str = "oci-device-hook",
                 name: str = "oci-device-hook") -> dict[str, str]:  # fmt: skip
    """Every template of ``chart`` rendered as ``helm template`` would (values merged over the
    chart's values.yaml): {template file name: text}. Files starting with ``_`` are skipped."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    merged = _merge(yaml.safe_load((chart / "values.yaml").read_text()) or {}, values or {})
    context = {
        "Values": merged,
        "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta.get("appVersion")},
        "Release": {"Name": name, "Namespace": namespace, "Service": "Helm"},
        "Files": Files(chart),
    }
    return {
        p.name: render_template(p.read_text(), context)
        for p in sorted((chart / "templates").glob("*.yaml"))
        if not p.name.startswith("_")
    }
