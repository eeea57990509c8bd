"""Follow a sweep directory through the calls that pass it on, and count how often the path climbs back up a floor.

Read from the source with ``ast`` (nothing is imported or run). From the entry function (default
``normlab.experiments.sweepdir.run_sweep``) and its parameter (default ``sweep_dir``), the walk visits, depth first and
in source order, every function that receives the directory: a call passes it on when one of its arguments mentions a
name that holds it (the parameter, or a local assigned from an expression that mentions one: ``run_dir = sweep_dir /
"runs" / run_id``; a ``for`` target over one; a nested function sees its enclosing function's names). The callee is
found from the caller's imports, its module's functions and classes (``Store(path)`` is ``Store.__init__``),
``self.method`` and nested functions; the receiving parameter is named by position or keyword, and each (function,
parameter) is visited once. A method of an object the walk cannot type (``store.update``) is not followed.

Each visit stands on its module's floor (``FLOORS`` of tests/test_layers.py, lowest first). Every call (a distinct
caller and callee, wherever the walk meets it) that passes the directory down to a lower floor *returns to a higher
floor it had already left* once (a chain experiments -> run -> io returns twice); counted over calls, not visits, so
the number does not depend on the order in which the walk first meets a function. Printed: the files entered, the
visits and that count; with ``--walk`` every visit and every call down a floor. An object
that keeps the directory (``self.sweep_dir = sweep_dir``) passes it on through its methods that read it: they are
visited once its constructor is done. Not seen: calls through a process boundary (a worker started with the
directory on its command line, a Ray task) and through callables passed as values.

    python benchmarks/sweep_dir_path.py                      # files entered, returns to a higher floor
    python benchmarks/sweep_dir_path.py --walk               # every visit: floor, function, receiving parameter
    python benchmarks/sweep_dir_path.py --entry normlab.experiments.entry:run --param out
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.test_layers import FLOOR  # noqa: E402  (the one list of floors)



def module_of(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def floor_of(module: str) -> int:
    parts = module.split(".")
    return FLOOR[parts[1] if len(parts) > 1 else ""]


@dataclass
class Func:
    """One function or method: its module, qualified name, node, class (for ``self.``) and enclosing function."""

    module: str
    qual: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None = None
    parent: "Func | None" = None
    nested: dict[str, "Func"] = field(default_factory=dict)

    @property
    def params(self) -> list[str]:
        a = self.node.args
        return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]


@dataclass
class Module:
    name: str
    tree: ast.Module
    funcs: dict[str, Func] = field(default_factory=dict)  # top-level functions and "Class.method"
    classes: set[str] = field(default_factory=set)
    bases: dict[str, list[str]] = field(default_factory=dict)  # class -> its base classes defined in this module

    def method(self, cls: str | None, name: str) -> "Func | None":
        """``cls.name`` or the first base class's (this module's classes only)."""
        while cls is not None:
            if f"{cls}.{name}" in self.funcs:
                return self.funcs[f"{cls}.{name}"]
            cls = next(iter(self.bases.get(cls, [])), None)
        return None

    def family(self, cls: str) -> list[str]:
        """``cls`` and the classes of this module derived from it."""
        return [c for c in self.classes if c == cls or cls in self._ancestors(c)]

    def _ancestors(self, cls: str) -> list[str]:
        out = []
        for b in self.bases.get(cls, []):
            out += [b, *self._ancestors(b)]
        return out
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "module" or "module:name"


def _imports(nodes: list[ast.stmt] | ast.AST, module: str, is_pkg: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    pkg = module if is_pkg else module.rpartition(".")[0]
    walk = nodes if isinstance(nodes, list) else [nodes]
    for top in walk:
        for n in ast.walk(top):
            if isinstance(n, ast.Import):
                for a in n.names:
                    if a.name.startswith("normlab"):
                        out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                if base.startswith("normlab"):
                    for a in n.names:
                        out[a.asname or a.name] = f"{base}:{a.name}"
    return out


def load(root: Path = REPO) -> dict[str, Module]:
    """Every module of ``root/normlab``, parsed."""
    mods: dict[str, Module] = {}
    for path in sorted((root / "normlab").rglob("*.py")):
        name = module_of(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        m = Module(name, tree)
        top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        m.imports = _imports(top, name, path.name == "__init__.py")
        for n in tree.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                m.funcs[n.name] = _func(name, n.name, n, None, None)
            elif isinstance(n, ast.ClassDef):
                m.classes.add(n.name)
                m.bases[n.name] = [b.id for b in n.bases if isinstance(b, ast.Name)]
                for b in n.body:
                    if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        m.funcs[f"{n.name}.{b.name}"] = _func(name, f"{n.name}.{b.name}", b, n.name, None)
        mods[name] = m
    return mods


def _func(module: str, qual: str, node: ast.FunctionDef | ast.AsyncFunctionDef, cls: str | None,
          parent: Func | None) -> Func:
    f = Func(module, qual, node, cls, parent)
    for n in ast.walk(node):
        if n is not node and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name not in f.nested:
            f.nested[n.name] = _func(module, f"{qual}.{n.name}", n, cls, f)
    return f


def _mentions(expr: ast.AST, names: set[str]) -> bool:
    """Whether ``expr`` is the directory or a path under it: a name holding it (``self.attr`` for an attribute an
    object keeps it in), ``EXPR / part``, ``Path(EXPR)``, ``str(EXPR)``, ``EXPR.resolve()`` / ``.parent``, a list
    of such paths (not any expression that merely uses one)."""
    if isinstance(expr, ast.Name):
        return expr.id in names
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and f"self.{expr.attr}" in names:
        return expr.value.id == "self"
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        return _mentions(expr.left, names)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("Path", "str") and expr.args:
        return _mentions(expr.args[0], names)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in ("resolve",
                                                                                                  "absolute"):
        return _mentions(expr.func.value, names)
    if isinstance(expr, ast.Attribute) and expr.attr == "parent":
        return _mentions(expr.value, names)
    if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):  # a list of paths under it
        return any(_mentions(e, names) for e in expr.elts)
    if isinstance(expr, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        return _mentions(expr.elt, names)
    if isinstance(expr, ast.IfExp):
        return _mentions(expr.body, names) or _mentions(expr.orelse, names)
    return False


class Walker:
    def __init__(self, mods: dict[str, Module]):
        self.mods = mods
        self.seen: set[tuple[str, str, str]] = set()
        self.kept: dict[tuple[str, str], set[str]] = {}  # (module, class) -> "self.attr" names holding it
        self.pending: list[tuple[Func, str]] = []
        self.edges: set[tuple[str, str]] = set()  # ("module:qual" of the caller, of the callee): passed on
        self.walk: list[tuple[int, Func, str]] = []  # (depth, function, receiving parameter)

    def _lookup(self, target: str) -> Func | None:
        """``module`` / ``module:name`` (a function, a class's ``__init__``, or a submodule's name) -> Func."""
        mod, _, name = target.partition(":")
        m = self.mods.get(mod)
        if m is None:
            return None
        if name in m.funcs:
            return m.funcs[name]
        if name in m.classes:
            return m.method(name, "__init__")
        if name in m.imports:  # a re-export
            return self._lookup(m.imports[name])
        return None

    def resolve(self, call: ast.Call, f: Func, local_imports: dict[str, str]) -> tuple[Func | None, bool]:
        """The called Func and whether it is a bound method (its first parameter is ``self``)."""
        fn = call.func
        if isinstance(fn, ast.Name):
            scope: Func | None = f
            while scope is not None:
                if fn.id in scope.nested:
                    return scope.nested[fn.id], False
                scope = scope.parent
            m = self.mods[f.module]
            target = local_imports.get(fn.id) or m.imports.get(fn.id)
            if target:
                found = self._lookup(target)
                return found, bool(found and ":" in target and target.partition(":")[2] in
                                   self.mods.get(target.partition(":")[0], Module("", ast.Module())).classes)
            if fn.id in m.funcs:
                return m.funcs[fn.id], False
            if fn.id in m.classes:
                return m.method(fn.id, "__init__"), True
            return None, False
        if (isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Call) and isinstance(fn.value.func, ast.Name)
                and fn.value.func.id == "super" and f.cls):
            m = self.mods[f.module]
            return m.method(next(iter(m.bases.get(f.cls, [])), None), fn.attr), True
        if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name):
            if fn.value.id == "self" and f.cls:
                return self.mods[f.module].method(f.cls, fn.attr), True
            target = local_imports.get(fn.value.id) or self.mods[f.module].imports.get(fn.value.id)
            if target:
                mod = target.replace(":", ".")
                if mod in self.mods:
                    found = self._lookup(f"{mod}:{fn.attr}")
                    return found, fn.attr in self.mods[mod].classes
        return None, False

    def visit(self, f: Func, param: str, depth: int, outer: frozenset[str] = frozenset()) -> None:
        key = (f.module, f.qual, param)
        if key in self.seen:
            return
        self.seen.add(key)
        self.walk.append((depth, f, param))
        names = set(outer) - set(f.params) | {param}
        local_imports = _imports(f.node.body, f.module, False)
        body = f.node.body
        for stmt in body:
            self._stmt(stmt, f, names, local_imports, depth)
        self._visit_kept(f, depth)

    def _keep(self, f: Func, attr: str) -> None:
        """``self.attr`` of ``f``'s class holds the directory: the methods of the class (and of the classes derived
        from it) that read it are visited once the constructor is done (as called by whoever holds the object: the
        walk cannot see those calls)."""
        kept = self.kept.setdefault((f.module, f.cls or ""), set())
        if attr not in kept:
            kept.add(attr)
            self.pending.append((f, attr))

    def _visit_kept(self, f: Func, depth: int) -> None:
        mine = [(g, a) for g, a in self.pending if g is f]
        self.pending = [(g, a) for g, a in self.pending if g is not f]
        m = self.mods[f.module]
        for _, attr in mine:
            kept = frozenset(f"self.{a}" for a in self.kept[(f.module, f.cls or "")])
            for cls in sorted(m.family(f.cls or "")):
                for qual, meth in m.funcs.items():
                    if meth.cls == cls and meth is not f and any(
                            isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.value, ast.Name)
                            and n.value.id == "self" for n in ast.walk(meth.node)):
                        self.visit(meth, f"self.{attr}", depth, kept)

    def _stmt(self, stmt: ast.stmt, f: Func, names: set[str], imports: dict[str, str], depth: int) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return  # entered when called
        # calls first (in source order), then what the statement binds
        for n in _calls_in_order(stmt):
            passed = [(i, a) for i, a in enumerate(n.args) if _mentions(a, names)]
            kw = [(k.arg, k.value) for k in n.keywords if k.arg and _mentions(k.value, names)]
            if not passed and not kw:
                continue
            callee, bound = self.resolve(n, f, imports)
            if callee is None:
                continue
            params = callee.params[1:] if bound and callee.params[:1] == ["self"] else callee.params
            if callee.params[:1] == ["self"] and not bound and f.cls is None:
                params = callee.params[1:]
            targets = [params[i] for i, _ in passed if i < len(params)] + [k for k, _ in kw if k in callee.params]
            outer = frozenset(names) if callee.parent is not None else frozenset()
            if targets:
                self.edges.add((f"{f.module}:{f.qual}", f"{callee.module}:{callee.qual}"))
            for p in dict.fromkeys(targets):
                self.visit(callee, p, depth + 1, outer)
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
            tgts = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            values = stmt.value.elts if isinstance(stmt.value, ast.Tuple) and len(tgts) == 1 and isinstance(
                tgts[0], ast.Tuple) and len(tgts[0].elts) == len(stmt.value.elts) else None
            pairs = list(zip(tgts[0].elts, values)) if values is not None else [(t, stmt.value) for t in tgts]
            for t, v in pairs:
                if not _mentions(v, names):
                    continue
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name) and n.id != "self"}
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" and f.cls:
                    names.add(f"self.{t.attr}")
                    self._keep(f, t.attr)
        if isinstance(stmt, (ast.For, ast.AsyncFor)) and _mentions(stmt.iter, names):
            names |= {n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)}
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None and _mentions(item.context_expr, names):
                    names |= {n.id for n in ast.walk(item.optional_vars) if isinstance(n, ast.Name)}
        for child in _child_blocks(stmt):
            for s in child:
                self._stmt(s, f, names, imports, depth)


def _child_blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    out = []
    for attr in ("body", "orelse", "finalbody"):
        block = getattr(stmt, attr, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            out.append(block)
    for h in getattr(stmt, "handlers", []) or []:
        out.append(h.body)
    for c in getattr(stmt, "cases", []) or []:
        out.append(c.body)
    return out


def _calls_in_order(stmt: ast.stmt) -> list[ast.Call]:
    """The calls of ``stmt`` itself (not of its nested blocks), in source order."""
    skip = {id(s) for block in _child_blocks(stmt) for s in block}
    found: list[ast.Call] = []

    def rec(n: ast.AST) -> None:
        for c in ast.iter_child_nodes(n):
            if id(c) in skip or isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            rec(c)
            if isinstance(c, ast.Call):
                found.append(c)

    rec(stmt)
    return sorted(found, key=lambda c: (c.lineno, c.col_offset))


def measure(entry: str, param: str, root: Path = REPO) -> dict:
    mods = load(root)
    w = Walker(mods)
    start = w._lookup(entry)
    if start is None:
        raise SystemExit(f"error: no function {entry} (give MODULE:FUNCTION)")
    w.visit(start, param, 0)
    # each call (caller, callee) that passes it down a floor: its return climbs back up
    down = sorted(f"{a} -> {b}" for a, b in w.edges if floor_of(b.partition(":")[0]) < floor_of(a.partition(":")[0]))
    returns = len(down)
    files = list(dict.fromkeys(f.module for _, f, _ in w.walk))
    return {"entry": entry, "param": param, "files": len(files), "visits": len(w.walk), "returns_up": returns,
            "modules": files, "down_calls": down,
            "walk": [(d, floor_of(f.module), f"{f.module}:{f.qual}", p) for d, f, p in w.walk]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entry", default="normlab.experiments.sweepdir:run_sweep", help="MODULE:FUNCTION to start from")
    p.add_argument("--param", default="sweep_dir", help="its parameter holding the sweep directory")
    p.add_argument("--walk", action="store_true", help="print every visit (depth, floor, function, parameter)")
    p.add_argument("--root", type=Path, default=REPO, help="a checkout whose normlab/ to read (e.g. an older commit "
                   "unpacked with git archive); default this one")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    res = measure(args.entry, args.param, args.root)
    if args.json:
        print(json.dumps({k: v for k, v in res.items() if args.walk or k != "walk"}, indent=1))
        return 0
    if args.walk:
        for d, fl, name, prm in res["walk"]:
            print(f"{'  ' * d}[{fl:2d}] {name}({prm})")
        print("calls down a floor (each returns up once):", *res["down_calls"], sep="\n  ")
    print(f"{res['entry']}({res['param']}): enters {res['files']} files in {res['visits']} visits, returns to a "
          f"higher floor {res['returns_up']} times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
