"""The package's layers (docs/architecture.md), checked on the source with ``ast``:

- every package (or top-level module) of ``normlab`` has a floor (``FLOORS``, lowest first); every import, at module
  level, inside a function or under ``if TYPE_CHECKING:``, points to the same package or a lower floor, never up
  and never sideways to another package on the same floor;
- no import cycle between modules, counting every import (a package's ``__init__`` and its own submodules excepted);
- no command except ``train`` imports the training loop, and outside ``train/`` only the modules that train do (a
  run directory's files have one owner: normlab.rundir.readers); each run-directory fact is defined once, in its owner;
- the run-directory readers, the JSON/text I/O and the report stay torch-free (sweep workers and reports use them).
- imports sit at the top of their module; one inside a function is an optional heavy dependency, a command's, or
  listed with its reason in ``LAZY_IMPORTS``.
- tests/ mirrors normlab/: every test file is named after the module it tests (a few cross-cutting ones aside).
"""

from __future__ import annotations

import ast
import keyword
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "normlab"

# Each package's floor, lowest first (docs/architecture.md draws the same order). A package imports only from its
# own package and from lower floors; packages on one floor do not import each other. "" is ``normlab/__init__.py``.
FLOORS: list[tuple[str, ...]] = [
    ("errors", "version"),
    ("", "io", "locks", "safety", "names", "validate", "stats", "resources", "markdown", "presets", "interrupt"),
    ("provenance", "plotting", "data", "norms"),
    ("attention",),
    ("model",),
    ("config",),
    ("config_help",),
    ("rundir",),
    ("eval", "diagnostics"),
    ("train",),
    ("convert", "interop"),
    ("surgery",),
    ("decide",),
    ("experiments",),
    ("report",),
    ("commands",),
    ("cli", "api"),
    ("demo", "__main__", "examples"),
]
FLOOR = {name: i for i, floor in enumerate(FLOORS) for name in floor}


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, *, top_level_only: bool) -> list[str]:
    """Absolute ``normlab.*`` modules imported by ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    nodes = []
    if top_level_only:  # what runs at import time: not function bodies, not ``if TYPE_CHECKING:``
        for n in tree.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                continue
            nodes += [m for m in ast.walk(n) if isinstance(m, (ast.Import, ast.ImportFrom))]
    else:
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    out = []
    for n in nodes:
        if isinstance(n, ast.Import):
            out += [a.name for a in n.names if a.name.startswith("normlab")]
        else:
            base = n.module or ""
            if n.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if base.startswith("normlab"):
                out.append(base)
                out += [f"{base}.{a.name}" for a in n.names]  # ``from normlab.x import y`` may name a module y
    return out


FILES = sorted(ROOT.rglob("*.py"))
MODULES = {_module(p) for p in FILES}


def _top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _owner(mod: str) -> str:
    """The module ``mod`` names: ``from normlab.x import name`` imports normlab.x."""
    while mod and mod not in MODULES:
        mod = mod.rpartition(".")[0]
    return mod


def test_every_package_has_a_floor():
    tops = {_top(_module(p)) for p in FILES}
    assert tops == set(FLOOR), (sorted(tops - set(FLOOR)), sorted(set(FLOOR) - tops))
    assert len(FLOOR) == sum(map(len, FLOORS)), "a package is on two floors"


@pytest.mark.parametrize("path", FILES, ids=lambda p: _module(p))
def test_every_import_points_down(path):
    mine = _top(_module(path))
    bad = sorted({m for m in map(_owner, _imports(path, top_level_only=False))
                  if _top(m) != mine and FLOOR[_top(m)] >= FLOOR[mine]})
    assert not bad, f"{_module(path)} (floor {FLOOR[mine]}) imports {[(m, FLOOR[_top(m)]) for m in bad]}"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` that is not a package's ``__init__`` with its own submodules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if d.startswith(m + "."):  # a package's __init__ importing its own submodules is how packages work
                continue
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                if not all(a.startswith(b + ".") or b.startswith(a + ".") for a, b in zip(cycle, cycle[1:])):
                    return cycle
            elif d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module-level", "every-import"])
def test_no_import_cycle(top_level_only):
    graph = {_module(p): {d for m in _imports(p, top_level_only=top_level_only)
                          if (d := _owner(m)) and d != _module(p)} for p in FILES}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_nothing_imports_the_package_root():
    """The version lives in ``normlab/version.py`` (lowest floor): no module reads a name from ``normlab/__init__.py``
    (the public API's lazy re-exports), only the example that shows the public API does."""
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        if _module(path) in ("normlab", "normlab.examples.api"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "normlab":
                names = [a.name for a in node.names if not _is_submodule(f"normlab.{a.name}")]
                if names:
                    offenders.append(f"{_module(path)}: from normlab import {', '.join(names)}")
            elif isinstance(node, ast.Import) and any(a.name == "normlab" for a in node.names):
                offenders.append(f"{_module(path)}: import normlab")
    assert offenders == []


def _is_submodule(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT.parent / rel).with_suffix(".py").is_file() or (ROOT.parent / rel / "__init__.py").is_file()


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"normlab.a": {"normlab.b"}, "normlab.b": {"normlab.c"}, "normlab.c": {"normlab.a"}}) == [
        "normlab.a", "normlab.b", "normlab.c", "normlab.a"]
    assert _cycle({"normlab.p": {"normlab.p.x"}, "normlab.p.x": {"normlab.p"}}) is None


# modules that train (and so may import the training loop): the train command, the library's ``train``, the sweep
# worker and norm removal's fine-tune; everything else reads run directories through normlab.rundir.readers
TRAINERS = {"normlab.commands.train", "normlab.api", "normlab.experiments.worker",
            "normlab.surgery.remove_norm"}


def test_only_modules_that_train_import_the_training_loop():
    users = {_module(p) for p in FILES if _top(_module(p)) != "train"
             and "normlab.train.loop" in _imports(p, top_level_only=False)}
    assert users <= TRAINERS, sorted(users - TRAINERS)


# each run-directory / file-writing fact is defined once, in its owner (a second copy is how the seams came apart)
_READERS = ("STATUS_EXIT", "read_summary", "iter_jsonl", "read_jsonl", "read_metrics", "read_curves", "read_initial",
            "last_step", "load_data", "run_data", "load_run", "open_run")
OWNERS = {**dict.fromkeys(_READERS, "normlab.rundir.readers"),
          "atomic_path": "normlab.io", "publish_dir": "normlab.io", "save_tensors": "normlab.rundir.tensors",
          "load_tensors": "normlab.rundir.tensors", "save_model": "normlab.rundir.tensors",
          "publish_run": "normlab.rundir.publish", "write_run": "normlab.rundir.publish",
          "copy_identity": "normlab.rundir.publish",
          "available_cores": "normlab.resources",
          "apply_norm_defaults": "normlab.config", "new_config": "normlab.config", "stored_config": "normlab.config",
          "planned_config": "normlab.config", "derive_config": "normlab.config", "fill_auto": "normlab.train.resolve"}


def test_run_directory_facts_have_one_definition():
    found: dict[str, list[str]] = {}
    for p in FILES:
        if _module(p) == "normlab.api":  # the library's public functions (api.load_run, ...) wrap the owners'
            continue
        for n in ast.parse(p.read_text(encoding="utf-8")).body:
            names = ([n.name] if isinstance(n, (ast.FunctionDef, ast.ClassDef)) else
                     [t.id for t in n.targets if isinstance(t, ast.Name)] if isinstance(n, ast.Assign) else [])
            for name in names:
                if name in OWNERS:
                    found.setdefault(name, []).append(_module(p))
    assert found == {name: [owner] for name, owner in OWNERS.items()}



# a config is completed where the decision is made (normlab.config: new, planned, stored, derived; the resolver:
# vocab_size, the norm defaults of a planned run, every auto), nowhere else
COMPLETERS = {"config_from_dict", "apply_norm_defaults", "fill_auto"}
COMPLETING = {"normlab.config", "normlab.train.resolve"}


def test_configs_are_completed_only_in_config_and_the_resolver():
    calls = set()
    for p in FILES:
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Call):
                name = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)
                if name in COMPLETERS:
                    calls.add(_module(p))
    assert calls == COMPLETING, sorted(calls)

# modules whose file names are not a run directory's: the token cache's tokenizer.json, an HF model directory's
OTHER_DIRECTORIES = {"normlab.data.cache", "normlab.data.tokenizer", "normlab.interop.hf_tokenizer",
                     "normlab.interop.hf_files"}


def test_run_directory_file_names_are_defined_once():
    """Every file name of a run directory is a constant of normlab.rundir.files; no other module spells it."""
    import normlab.rundir.files as files

    names = {getattr(files, n) for n in files.__all__}
    found = []
    for p in FILES:
        if _module(p) in OTHER_DIRECTORIES | {"normlab.rundir.files"}:
            continue
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Constant) and n.value in names:
                found.append(f"{_module(p)}:{n.lineno} {n.value!r}")
    assert not found, found


def test_run_directory_readers_io_and_report_do_not_import_torch():
    code = ("import sys, normlab.io, normlab.rundir, normlab.rundir.files, normlab.rundir.readers, "
            "normlab.experiments.worker, "
            "normlab.experiments.progress, normlab.report; "
            "from normlab.rundir.readers import read_metrics, read_summary, STATUS_EXIT; "
            "print(sorted(m for m in ('torch', 'safetensors.torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_io_alone_does_not_import_torch():
    code = "import sys, normlab.io; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_commands_own_their_flags():
    """``cli.py`` only dispatches: its one ``add_argument`` calls are the global ``--debug`` / ``--version``; every
    subcommand is registered by its own module, named as the command, whose function it runs."""
    from normlab.cli import COMMAND_MODULES, build_parser

    tree = ast.parse((ROOT / "cli.py").read_text(encoding="utf-8"))
    flags = [ast.literal_eval(n.args[0]) for n in ast.walk(tree)
             if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument"]
    assert flags == ["--debug", "--version"]
    sub = next(a for a in build_parser()._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    for name, parser in sub.choices.items():
        func = parser.get_default("func")
        assert func.__module__.rpartition(".")[2] in COMMAND_MODULES, (name, func.__module__)
        assert func.__module__.startswith("normlab.commands."), (name, func.__module__)
        # one module per command, named as the command ("remove-norm" -> remove_norm, a keyword gets "_")
        module = name.replace("-", "_") + ("_" if keyword.iskeyword(name) else "")
        assert func.__module__ == f"normlab.commands.{module}", (name, func.__module__)
    assert len(sub.choices) == len(COMMAND_MODULES)


def test_building_the_parser_does_not_import_torch_or_scipy():
    """``normlab --help`` stays fast: neither torch nor SciPy (about 0.7 s to import; ``normlab.stats`` loads its
    names on first use, so the run-directory readers' ``stats.learning`` does not pull it in)."""
    code = ("import sys; from normlab.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_issue_numbers_in_the_source():
    """The source explains itself: no "issue N" reference (the tracker's history is not the reader's context)."""
    import re

    found = [f"{_module(p)}:{i}" for p in FILES for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bissues? #?\d+", line, re.IGNORECASE)]
    assert not found, found


def _defined_names(init: Path) -> set[str]:
    """Names a package's ``__init__.py`` binds at module level (defs, classes, assignments, imports)."""
    names: set[str] = set()
    for n in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                names |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return names


def _resolves(mod: str) -> bool:
    rel = Path(*mod.split("."))
    return (ROOT.parent / rel).with_suffix(".py").is_file() or (ROOT.parent / rel / "__init__.py").is_file()


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_normlab_import_resolves(path):
    """Every ``import normlab.x`` / ``from normlab.x import y`` names a module that exists, and ``y`` is a submodule
    or a name the package binds: a moved module leaves no stale import behind, not even inside a function (the
    floors above cannot see an import of a module that no longer exists)."""
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    bad = []
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, ast.Import):
            bad += [a.name for a in n.names if a.name.startswith("normlab") and not _resolves(a.name)]
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if not base.startswith("normlab"):
                continue
            if not _resolves(base):
                bad.append(base)
                continue
            init = ROOT.parent / Path(*base.split(".")) / "__init__.py"
            if init.is_file():
                names = _defined_names(init)
                bad += [f"{base}.{a.name}" for a in n.names
                        if a.name != "*" and not _resolves(f"{base}.{a.name}") and a.name not in names]
    assert not bad, f"{mod} imports what does not exist: {bad}"


# Test files named for no module: properties of the whole package (docs, layers, install, --help) and the tests that
# need hardware or a cluster the suite may not have (cuda: a GPU; ray: a local Ray cluster, all slow).
CROSS_CUTTING_TESTS = {"test_docs", "test_layers", "test_install", "test_help", "test_cuda", "test_ray"}


def test_every_test_file_is_named_after_a_module():
    """tests/ mirrors normlab/ as folders: ``tests/<path>/test_<name>.py`` tests ``normlab/<path>/<name>.py`` or the
    package ``normlab/<path>/<name>/`` (a command module named after a keyword, ``import_``, counts as ``import``), so
    a newcomer finds a module's tests where the module is; only the whole-package checks sit at the top, named
    otherwise."""
    tests = Path(__file__).resolve().parent
    stray = []
    for p in sorted(tests.rglob("test_*.py")):
        rel = p.relative_to(tests)
        if rel.parent == Path(".") and p.stem in CROSS_CUTTING_TESTS:
            continue
        name = p.stem.removeprefix("test_")
        here = ROOT / rel.parent
        if not any(f.is_file() for f in (here / f"{name}.py", here / f"{name}_.py", here / name / "__init__.py")):
            stray.append(str(rel))
    assert not stray, f"test files that name no module at their place in normlab/: {stray}"


def test_every_test_folder_is_a_package():
    """Each folder of tests/ has an ``__init__.py``, so two ``test_<name>.py`` in different folders import apart."""
    tests = Path(__file__).resolve().parent
    folders = {p.parent for p in tests.rglob("test_*.py")}
    assert [str(f) for f in sorted(folders) if not (f / "__init__.py").is_file()] == []


# Imports sit at the top of their module: a function-local import is still a dependency, only hidden (and leaves its
# names untyped). Allowed inside a function: an optional heavy dependency (an extra, or a tracker, or matplotlib, slow
# to import and needed by few paths); an import guarded by ``except ImportError`` (optional by construction); in
# commands/, normlab modules and torch (``normlab --help`` builds every command's parser and must not load torch, so
# a command loads what it runs inside its ``run_*``); and the entries of LAZY_IMPORTS, each with its reason.
OPTIONAL_DEPENDENCIES = ("transformers", "accelerate", "datasets", "lm_eval", "ray", "tensorboard", "tensorboardX",
                         "wandb", "mlflow", "matplotlib")
_TORCH_FREE = "the run-directory readers stay torch-free (sweep workers, reports, `normlab runs` use them)"
# (importing module or package, imported module prefixes or "*" for any) -> why the import stays in its function
LAZY_IMPORTS: dict[tuple[str, tuple[str, ...]], str] = {
    ("normlab.locks", ("fcntl",)): "fcntl exists only on POSIX; the trainer, compare and the caches import "
                                   "normlab.locks, whose lock functions alone need it",
    ("normlab.demo", ("normlab.experiments",)): "set_process_policies() (OpenMP wait policy, heap) must run before "
                                                "torch loads; the sweep module imports torch",
    ("normlab.norms.batchstat", ("torch.distributed.nn",)): "torch.distributed.nn.functional fails to import on a "
                                                            "torch built without distributed support",
    ("normlab.rundir.readers", ("torch", "normlab.config", "normlab.model", "normlab.norms", "normlab.attention",
                            "normlab.rundir.tensors")): _TORCH_FREE,
    ("normlab.rundir.readers", ("normlab.data",)): "normlab.data brings numpy and tokenizers: importing the readers "
                                              "takes 0.045 s of CPU without it, 0.18 s with it",
    ("normlab.rundir.fingerprint", ("torch", "normlab.model")): _TORCH_FREE,
    ("normlab.rundir.publish", ("normlab.config", "normlab.rundir.tensors")): _TORCH_FREE,
    ("normlab.surgery.robustness", ("normlab.surgery", "normlab.eval")): "report/ reads the cached robustness "
                                                                          "numbers through this module and stays "
                                                                          "torch-free",
    ("normlab.experiments", ("normlab.experiments.entry",)): "the package's ``run`` (entry.run) loads on first use: "
                                                            "a worker that only records results imports the package "
                                                            "and no torch",
    ("normlab.experiments.worker", ("torch", "normlab.config", "normlab.train", "normlab.eval")): "result recording "
        "stays torch-free: torch, the config and the trainer load where a run trains, the probes where diag.probes "
        "asks",
    ("normlab.experiments.sizes", ("torch", "normlab.config", "normlab.model")): "report/ reads the size rules "
        "(report.scaling) and stays torch-free; count_params builds a model, size_points resolves a config",
    ("normlab.train.distributed", ("torch.distributed.run", "torch.distributed.elastic")): "torch's elastic "
        "launcher: only `train --nproc` needs it (0.13 s to import after torch), and it fails to import on a torch "
        "built without distributed support",
}


def _guarded_by_import_error(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a ``try`` whose handlers catch ImportError (or ModuleNotFoundError)."""
    out: set[int] = set()
    for t in ast.walk(tree):
        if isinstance(t, ast.Try) and any(h.type is not None and {"ImportError", "ModuleNotFoundError"}
                                          & {x.id for x in ast.walk(h.type) if isinstance(x, ast.Name)}
                                          for h in t.handlers):
            out |= {id(n) for s in t.body for n in ast.walk(s) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def _function_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import inside a function body of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    guarded = _guarded_by_import_error(tree)
    found = []
    for f in ast.walk(tree):
        if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for n in ast.walk(f):
            if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in guarded:
                if isinstance(n, ast.Import):
                    found += [(n.lineno, a.name) for a in n.names]
                else:
                    base = n.module or ""
                    if n.level:
                        up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                        base = ".".join(up + ([base] if base else []))
                    found.append((n.lineno, base))
    return sorted(set(found))


def _under(name: str, prefix: str) -> bool:
    return prefix == "*" or name == prefix or name.startswith(prefix + ".")


def _in(module: str, key: str) -> bool:
    """``module`` is ``key`` or inside package ``key`` (the key "normlab" is the package root alone)."""
    return module == key or (key != "normlab" and module.startswith(key + "."))


def _lazy_allowed(importer: str, imported: str, entries: dict | None = None) -> bool:
    """Whether module ``importer`` may import ``imported`` inside a function (``entries``: LAZY_IMPORTS)."""
    if imported.split(".")[0] in OPTIONAL_DEPENDENCIES:
        return True
    if _under(importer, "normlab.commands") and (_under(imported, "normlab") or _under(imported, "torch")):
        return True
    entries = LAZY_IMPORTS if entries is None else entries
    return any(_in(importer, who) and any(_under(imported, p) for p in what) for who, what in entries)


def test_imports_are_at_the_top():
    """Every import inside a function is in an allowed category (above); anything else belongs at the top of its
    module (where a cycle or an upward import would show, and test_every_import_points_down checks it)."""
    hidden = [f"{_module(p)}:{line} imports {name}" for p in FILES for line, name in _function_imports(p)
              if not _lazy_allowed(_module(p), name)]
    assert not hidden, hidden


def test_lazy_import_entries_are_used():
    """An entry of LAZY_IMPORTS that no function-local import needs any more (none left, or each one allowed anyway:
    an optional dependency, a command's) is removed, so the list stays the truth."""
    used = {key for p in FILES for _, name in _function_imports(p) for key in LAZY_IMPORTS
            if _in(_module(p), key[0]) and any(_under(name, q) for q in key[1])
            and not _lazy_allowed(_module(p), name, entries={})}
    assert set(LAZY_IMPORTS) - used == set()


def test_the_function_import_rule():
    tree = ast.parse("def f():\n    if x:\n        import a.b\n    try:\n        import c\n    except ImportError:\n"
                     "        pass\n")
    guarded = _guarded_by_import_error(tree)
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import)]
    assert [n.names[0].name for n in imports if id(n) not in guarded] == ["a.b"]
    assert not _lazy_allowed("normlab.eval.lm", "normlab.rundir.readers")
    assert not _lazy_allowed("normlab.eval.lm", "json")
    assert not _lazy_allowed("normlab.commands.eval", "json")
    assert _lazy_allowed("normlab.commands.eval", "normlab.eval.lm")
    assert _lazy_allowed("normlab.plotting", "matplotlib.pyplot")
    assert _lazy_allowed("normlab.rundir.readers", "torch")
    assert not _lazy_allowed("normlab.rundir.readers", "torch", entries={})
    assert _lazy_allowed("normlab.experiments.worker", "torch")
    assert not _lazy_allowed("normlab.experiments.store", "torch") and not _lazy_allowed("normlab.eval.lm", "torch")
    assert _in("normlab", "normlab") and not _in("normlab.eval.lm", "normlab")
