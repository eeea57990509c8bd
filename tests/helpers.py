"""Shared helpers for the tests: run the CLI in this process (``run_inproc``) or in a subprocess (``normlab``), read
run directories, seeded tensors for the norm tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

TINY = [
    "--set", "train.steps=24", "--set", "train.checkpoint_every=4", "--set", "train.eval_every=12",
    "--set", "train.log_every=4", "--set", "model.dropout=0.1",
]


def cli_env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"NORMLAB_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    return env


def normlab(*args: str, cache: Path, check: bool = False, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m normlab.cli ARGS`` and capture its output."""
    proc = subprocess.run([sys.executable, "-m", "normlab.cli", *args], capture_output=True, text=True,
                          env=cli_env(cache), **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"normlab {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


def run_inproc(*args: str, cache: Path, check: bool = False) -> subprocess.CompletedProcess:
    """Run the CLI in this process (``normlab.cli.main``, no torch import per call); same exit codes and streams.

    What a command changes process-wide is put back afterwards: ``NORMLAB_CACHE_DIR`` and the torch thread count
    (train, the claims and the packer set it from ``train.threads``). Signal handlers are restored by the commands
    themselves. Keep a subprocess (``normlab``) for signals, a real process's exit, installs and import-time
    environment variables."""
    import contextlib
    import io

    import torch

    from normlab.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.environ.get("NORMLAB_CACHE_DIR")
    threads = torch.get_num_threads()
    os.environ["NORMLAB_CACHE_DIR"] = str(cache)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse errors
                code = int(e.code or 0)
    finally:
        torch.set_num_threads(threads)
        if old is None:
            os.environ.pop("NORMLAB_CACHE_DIR", None)
        else:
            os.environ["NORMLAB_CACHE_DIR"] = old
    proc = subprocess.CompletedProcess(["normlab", *args], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"normlab {' '.join(args)} failed ({code}): {proc.stderr[-2000:]}")
    return proc


def weights(run_dir: Path) -> dict:
    return load_file(str(run_dir / "model.safetensors"))


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def assert_same_weights(a: Path, b: Path) -> None:
    """Final weights of two run directories are equal bit for bit."""
    import torch

    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), f"{k} differs"


class HostReads:
    """The CPU stand-in for ``torch.cuda.set_sync_debug_mode``: inside ``with HostReads() as r``, every host read of a
    tensor's value (``aten._local_scalar_dense``: ``.item()``, ``float()``, ``bool()``, an ``if`` on a tensor; and
    ``.tolist()``) is listed in ``r.reads[r.step]`` (``r.step`` set by the test where a step starts), named by the
    nearest normlab or torch.optim frame (``"runstate.py:after_backward"``, ``"tolist loop.py:get_batch"``)."""

    def __init__(self) -> None:
        import collections

        self.reads: dict[int, list[str]] = collections.defaultdict(list)
        self.step = -1

    @staticmethod
    def where() -> str:
        import traceback

        for fr in reversed(traceback.extract_stack()[:-2]):
            if "normlab" in fr.filename.split(os.sep) or f"torch{os.sep}optim" in fr.filename:
                return f"{os.path.basename(fr.filename)}:{fr.name}"
        return "?"

    def __enter__(self) -> HostReads:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        reads, tolist = self, torch.Tensor.tolist

        class Reads(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten._local_scalar_dense.default:
                    reads.reads[reads.step].append(reads.where())
                return func(*args, **(kwargs or {}))

        def counted_tolist(t):
            reads.reads[reads.step].append("tolist " + reads.where())
            return tolist(t)

        self._tolist, self._mode = tolist, Reads()
        torch.Tensor.tolist = counted_tolist
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        import torch

        self._mode.__exit__(*exc)
        torch.Tensor.tolist = self._tolist


# Installed as ``sitecustomize`` in every Python process of a killed run (the CLI, torchrun and its ranks): when
# ``normlab.rundir.tensors`` is first imported, its ``save_checkpoint`` is wrapped so that the process SIGKILLs itself
# as it is about to write the first checkpoint after step NORMLAB_TEST_KILL_AFTER (the steps since that checkpoint
# are done and lost, as in a kill anywhere between the two checkpoints). Deterministic: no polling race, however
# loaded the machine is.
_KILL_HOOK = """
import importlib.abc, importlib.util, os, signal, sys

_after = int(os.environ["NORMLAB_TEST_KILL_AFTER"])


class _KillHook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "normlab.rundir.tensors":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            real = module.save_checkpoint

            def save_checkpoint(run_dir, at, *args, **kwargs):
                if at > _after:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(run_dir, at, *args, **kwargs)

            module.save_checkpoint = save_checkpoint

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _KillHook())
"""


def kill_9_after(args: list[str], out: Path, cache: Path, checkpoint_step: int) -> None:
    """Run ``normlab ARGS --out OUT`` until it is SIGKILLed between checkpoint ``checkpoint_step`` and the next one
    (the process kills itself before writing the next checkpoint: see ``_KILL_HOOK``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as hook:
        (Path(hook) / "sitecustomize.py").write_text(_KILL_HOOK)
        env = cli_env(cache)
        env["NORMLAB_TEST_KILL_AFTER"] = str(checkpoint_step)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (hook, env.get("PYTHONPATH", "")) if x)
        proc = subprocess.Popen([sys.executable, "-m", "normlab.cli", *args, "--out", str(out)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                import signal

                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert (out / "checkpoints" / f"step_{checkpoint_step:08d}").exists(), "killed before the checkpoint"


_KILL_IN_HOOK = """
import importlib.abc, importlib.util, os, signal, sys

_module, _function = os.environ["NORMLAB_TEST_KILL_IN"].split(":")


class _KillHook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            setattr(module, _function, lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL))

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _KillHook())
"""


def kill_9_in(args: list[str], out: Path, cache: Path, where: str) -> None:
    """Run ``normlab ARGS --out OUT`` until it SIGKILLs itself on calling ``where`` (``module:function``, replaced in
    the module as it is first imported, so also in modules that import the name from it later)."""
    import signal
    import tempfile

    with tempfile.TemporaryDirectory() as hook:
        (Path(hook) / "sitecustomize.py").write_text(_KILL_IN_HOOK)
        env = cli_env(cache)
        env["NORMLAB_TEST_KILL_IN"] = where
        env["PYTHONPATH"] = os.pathsep.join(x for x in (hook, env.get("PYTHONPATH", "")) if x)
        proc = subprocess.Popen([sys.executable, "-m", "normlab.cli", *args, "--out", str(out)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            assert proc.wait(timeout=300) == -signal.SIGKILL, f"not killed in {where}"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def assert_bad_input(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """The bad-input contract: exit status 2, exactly one stderr line starting ``error: `` that contains every
    fragment, and no traceback anywhere on stderr."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in err, err


def scratch_norm(monkeypatch, name: str, cls: type) -> str:
    """Register ``cls`` as norm ``name`` for one test, through ``register_norm`` (so it gets the declared facts'
    defaults, as a real norm would); the registry is restored afterwards."""
    from normlab.norms import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register_norm(name)(cls)
    return name


def scratch_attention(monkeypatch, name: str, cls: type) -> str:
    """Register ``cls`` as attention kind ``name`` for one test, through ``register_attention`` (it gets the
    declared facts' defaults, as a shipped kind would); the registry is restored afterwards."""
    from normlab.attention import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register_attention(name)(cls)
    return name


# a finished tiny run in a second: 8 steps, checkpoints at 4 and 8 (conftest's ``run`` fixture trains one per module)
SHORT = ["--set", "train.steps=8", "--set", "train.eval_every=4", "--set", "train.checkpoint_every=4",
         "--set", "train.log_every=2", "--set", "train.eval_batches=1", "--set", "model.depth=1",
         "--set", "diag.every=0"]


def tree(d: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``d`` (empty when ``d`` does not exist)."""
    import hashlib

    if not d.exists():
        return {}
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


HOSTILE = [  # (variant, seed, status, final val bpb): names as an attacker would choose them
    ("<script>alert(1)</script>", 0, "completed", 1.5), ("<script>alert(1)</script>", 1, "completed", 1.6),
    ("[/bold]x", 0, "completed", 1.7), ("[/bold]x", 1, "completed", None), ("a|b*_c_", 0, "completed", 1.8),
]


def make_sweep(d: Path, rows=HOSTILE) -> Path:
    """A sweep directory with a results store holding finished rows (no training needed)."""
    from normlab.config import load_config
    from normlab.experiments.store import Store

    d.mkdir()
    st = Store(d / "results.sqlite")
    st.create("hostile", "h0")
    cfg = load_config("tiny").to_dict()
    st.register([{"run_id": f"r{i}", "position": i, "variant": v, "seed": s, "config_hash": "c", "axes": {},
                  "overrides": {"model.norm": v}, "config": cfg} for i, (v, s, _, _) in enumerate(rows)])
    for i, (_, _, status, val) in enumerate(rows):
        st.finish(f"r{i}", {"status": status, "val_bpb": val, "best_val_bpb": val, "step": 8, "steps": 8,
                            "tokens_per_s": 100.0}, [(4, "val_bpb", 2.0), (8, "val_bpb", 1.5)])
    return d


def rand(*shape, seed=0, scale=1.0, shift=0.0):
    """A seeded fp64 normal tensor (the norm tests' inputs; their references are computed in fp64)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale + shift


def randomize_affine(m, seed=1):
    """Move a norm's ``weight`` (around 1) and ``bias`` (around 0) off their init, seeded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (m.weight, m.bias):
            if p is not None:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5 + (1.0 if p is m.weight else 0.0))


def register_sweep(d: Path, sweep):
    """A parsed sweep stored without training: ``d/sweep.yaml`` and ``d/results.sqlite`` with every run registered
    (the experiments store's own schema); returns the ``Store`` for the test to record finished runs in."""
    from normlab.experiments.store import Store
    from normlab.experiments.sweep import dump_spec

    d.mkdir(parents=True, exist_ok=True)
    (d / "sweep.yaml").write_text(dump_spec(sweep))
    store = Store(d / "results.sqlite")
    store.create(sweep.name, sweep.hash)
    store.register([{"run_id": r.run_id, "position": i, "variant": r.variant, "seed": r.seed,
                     "config_hash": r.config_hash, "axes": r.axes, "overrides": r.overrides, "config": r.config}
                    for i, r in enumerate(sweep.runs)])
    return store


ODD_NAME = "r\x1b[2J[red]x"  # a run directory name with an ANSI escape (clear screen) and rich markup


def assert_name_echoed_printable(command: str, run: Path, tmp_path: Path, cache: Path, *args: str) -> None:
    """``normlab COMMAND RUN ARGS`` on a copy of ``run`` named :data:`ODD_NAME` succeeds and echoes the name with the
    escape written out (safety.printable: ``\\x1b``), never the raw byte that would drive the terminal; the
    markup is shown as text."""
    odd = tmp_path / ODD_NAME
    shutil.copytree(run, odd)
    proc = run_inproc(command, str(odd), *args, cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    assert "r\\x1b[2J[red]x" in "".join(proc.stdout.split())  # a table may wrap its title
