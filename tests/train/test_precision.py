"""train.precision / train.compile / device: resolution of ``auto``, bf16 numerics against fp32, fp32 norm
statistics under autocast, bit-exact resume and exact conversions of a bf16 run."""

from __future__ import annotations

import copy
import hashlib
import json
import os

import pytest
import torch

from normlab.config import load_config
from normlab.model import build_model
from normlab.train import precision as P
from normlab.train.loop import train
from normlab.train.threads import step_flops
from tests.helpers import assert_bad_input, assert_same_weights, kill_9_after, normlab, run_inproc, summary

pytestmark = pytest.mark.usefixtures("one_thread")

# A shape where a bf16 step costs little even without bf16 matrix units.
SMALL = ["model.width=32", "model.context=32", "train.batch_size=4", "train.eval_batches=1", "diag.every=0"]
CLI_SMALL = [a for kv in SMALL for a in ("--set", kv)]


def _losses(run_dir) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "batchnorm", "powernorm", "unified"])
def test_bf16_losses_agree_with_fp32_over_first_steps(norm, tmp_path, cache, monkeypatch):
    """The stated tolerance: per-step training losses of bf16 and fp32 within 0.01 nats over the first 6 steps
    (same seed, same batches). Measured on 5 norms over 10 steps: at most 0.0017 nats apart."""
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    losses = {}
    for prec in ("fp32", "bf16"):
        cfg = load_config("tiny", SMALL + ["train.steps=6", "train.log_every=1", "train.eval_every=100",
                                           f"train.precision={prec}", f"model.norm={norm}"])
        s = train(cfg, tmp_path / prec, quiet=True)
        assert s["precision"] == prec and s["status"] == "completed"
        losses[prec] = _losses(tmp_path / prec)
    assert len(losses["fp32"]) == 6
    diff = max(abs(a - b) for a, b in zip(losses["fp32"], losses["bf16"]))
    assert diff <= 0.01, (norm, losses)
    assert losses["fp32"] != losses["bf16"], "bf16 changed nothing: autocast is not active"


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "batchnorm", "powernorm", "unified", "dyt", "scalenorm"])
def test_norms_compute_in_fp32_under_autocast(norm):
    """Under bf16 autocast each norm layer (block, final and QK norms) returns exactly what it computes in fp32,
    autocast off, on its input cast to fp32 -- batch statistics included -- while the linear layers run in bf16;
    parameters, gradients and buffers stay fp32."""
    cfg = load_config("tiny", [f"model.norm={norm}", "model.vocab_size=16", "model.qk_norm=true"]).model
    model = P.prepare_model(build_model(cfg), "bf16")
    layers = list(P.norm_layers(model))
    assert len(layers) >= 2 * cfg.depth
    checked, before = [], {}
    for i, m in enumerate(layers):
        m.register_forward_pre_hook(lambda mod, inp, i=i: before.__setitem__(i, copy.deepcopy(mod)))

        def check(mod, inp, out, i=i):
            with torch.autocast("cpu", enabled=False), torch.no_grad():
                ref = type(mod).forward(before[i], inp[0].float())
            checked.append((inp[0].dtype, out.dtype, torch.equal(out, ref)))

        m.register_forward_hook(check)
    head = []
    model.lm_head.register_forward_hook(lambda mod, inp, out: head.append(out.dtype))
    with P.autocast("cpu", "bf16"):
        model(torch.randint(16, (2, 16))).float().sum().backward()
    assert head == [torch.bfloat16]
    assert torch.bfloat16 in {c[0] for c in checked}, "no norm saw a bf16 input (QK-norm should)"
    assert all(c[1] == torch.float32 and c[2] for c in checked), checked
    assert all(b.dtype == torch.float32 for m in layers for b in m.buffers() if b.is_floating_point())
    assert all(
        p.dtype == torch.float32 and (p.grad is None or p.grad.dtype == torch.float32) for p in model.parameters()
    )


def test_auto_resolution_and_records(tmp_path, cache, monkeypatch):
    """On a CPU without bf16 units ``auto`` is fp32; with them, the probe decides with a 10% margin. The resolved
    values land in config.yaml and summary.json and are printed at start."""
    cfg = load_config("tiny", SMALL)
    monkeypatch.setattr(P, "fast_bf16", lambda device: (False, "no units"))
    assert P.resolve_precision(cfg, "cpu") == ("fp32", "auto: no units")
    monkeypatch.setattr(P, "fast_bf16", lambda device: (True, "units"))
    for fp32_s, bf16_s, want in ((1.0, 0.95, "fp32"), (1.0, 0.5, "bf16"), (1.0, 1.2, "fp32")):
        monkeypatch.setattr(P, "_cached_probe",
                            lambda c, d, t=(fp32_s, bf16_s): {"fp32": t[0], "bf16": t[1], "ratio": t[0] / t[1]})
        assert P.resolve_precision(cfg, "cpu")[0] == want
    monkeypatch.setattr(P, "has_triton", lambda: True)  # a CUDA machine's (this one may have no triton)
    assert P.resolve_compile("auto", "cpu")[0] is False and P.resolve_compile(True, "cuda")[0] is True
    # auto on CPU: on exactly from the payback work (when a C++ compiler exists), off below it
    assert P.resolve_compile("auto", "cpu", 0.99 * P.COMPILE_PAYBACK_FLOPS)[0] is False
    assert P.resolve_compile("auto", "cpu", P.COMPILE_PAYBACK_FLOPS)[0] is (P.cxx_compiler() is not None)
    tiny = load_config("tiny")
    assert P.resolve_compile("auto", "cpu", tiny.train.steps * step_flops(tiny))[0] is False  # presets run eager
    monkeypatch.setattr(P, "cxx_compiler", lambda: None)
    on, why = P.resolve_compile(True, "cpu")
    assert on is False and "no C++ compiler" in why
    monkeypatch.undo()

    out = tmp_path / "run"
    r = run_inproc("train", "tiny", *CLI_SMALL, "--set", "train.steps=2", "--set", "train.precision=bf16",
                   "--out", str(out), "--verbose", cache=cache)
    assert r.returncode == 0, r.stderr
    assert "device cpu" in r.stderr and "precision bf16 (set in the config)" in r.stderr  # --verbose: the reasons
    saved = (out / "config.yaml").read_text()
    assert "device: cpu" in saved and "precision: bf16" in saved and "compile: false" in saved
    s = summary(out)
    assert (s["device"], s["precision"], s["compile"], s["compile_s"]) == ("cpu", "bf16", False, None)
    want = "bf16" if P.fast_bf16("cpu")[0] else "fp32"
    out2 = tmp_path / "auto"
    run_inproc("train", "tiny", *CLI_SMALL, "--set", "train.steps=2", "--out", str(out2), cache=cache, check=True)
    if want == "fp32":
        assert summary(out2)["precision"] == "fp32"
    # --resume with the same (auto) config matches the resolved config.yaml
    r = run_inproc("train", "tiny", *CLI_SMALL, "--set", "train.steps=2", "--resume", str(out2), cache=cache)
    assert r.returncode == 0, r.stderr


def test_deterministic_kernels_switch_on_cuda_only_and_are_restored(monkeypatch):
    """``train.deterministic`` switches torch's deterministic algorithms on for a CUDA run only, sets a cuBLAS
    workspace config where none is set (keeps a user's), and ``kept_determinism`` restores the setting after the run,
    but keeps the cuBLAS workspace config (cuBLAS read it once, at the process's first handle)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # records the undo, then unset for the test
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    with P.kept_determinism():
        for value in (True, False, "auto"):  # a CPU switches nothing: its kernels are deterministic anyway
            assert P.use_deterministic_kernels("cpu", value) == (True, "")
            assert not torch.are_deterministic_algorithms_enabled()
        det, why = P.use_deterministic_kernels("cuda", False)
        assert not det and "train.deterministic: false" in why and "train.deterministic=true for exact" in why
        det, why = P.use_deterministic_kernels("cuda", "auto")  # the default: the fast path on CUDA
        assert not det and "auto: off on CUDA" in why and not torch.are_deterministic_algorithms_enabled()
        det, why = P.use_deterministic_kernels("cuda", True)
        assert det and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in why and torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    with P.kept_determinism():
        assert ":16:8" in P.use_deterministic_kernels("cuda", True)[1]
    assert not torch.are_deterministic_algorithms_enabled()


def test_deterministic_auto_is_the_default_and_hashes_as_true(monkeypatch):
    """``train.deterministic: auto`` is the default; it, and ``true`` (the default before), hash as a config without
    the key (stored CPU runs keep their hashes); ``false`` is another run. On CUDA the resolved value is what
    config.yaml records (``auto`` -> false), and a ``--resume`` config's ``auto`` takes the run's value."""
    from normlab.config import RunConfig, config_from_dict

    assert RunConfig().train.deterministic == "auto"
    a, t, f = (config_from_dict({"train": {"deterministic": v}}) for v in ("auto", True, False))
    assert a.hash() == t.hash() == config_from_dict({}).hash() != f.hash()
    assert "deterministic" not in a.identity_dict()["train"]
    cfg = load_config("tiny", ["train.compile=false", "train.precision=fp32"])
    monkeypatch.setattr(P, "resolve_device", lambda name: ("cuda", "test"))
    monkeypatch.setattr(P, "use_tf32", lambda dev, v: (True, ""))
    with P.kept_determinism():
        lines = P.resolve_runtime(cfg)
    assert cfg.train.deterministic is False and any(line.startswith("deterministic no (auto: off") for line in lines)
    base = load_config("tiny", [])
    from normlab.train.resolve import fill_auto

    fill_auto(base, cfg)
    assert base.train.deterministic is False


def test_an_op_without_a_deterministic_kernel_is_a_one_line_error(tmp_path, cache, monkeypatch):
    """With deterministic algorithms on (train.deterministic on CUDA), torch refusing an operation ends the run with
    one line naming train.deterministic=false, exit 2, no traceback; any other RuntimeError stays a crash."""
    import normlab.train.step as L  # the one training step (loop, stacked groups) computes the loss there

    def refuse(*a, **k):
        torch.use_deterministic_algorithms(True)  # as use_deterministic_kernels does on CUDA (restored by the run)
        raise RuntimeError("scatter_add_cuda_kernel does not have a deterministic implementation, but you set "
                           "'torch.use_deterministic_algorithms(True)'.\nmore text")

    monkeypatch.setattr(L, "lm_loss", refuse)
    out = tmp_path / "r"
    r = run_inproc("train", "tiny", *CLI_SMALL, "--set", "train.steps=2", "--out", str(out), cache=cache)
    last = r.stderr.strip().splitlines()[-1]  # after the run's start lines: one error line, no traceback
    assert r.returncode == 2 and "Traceback" not in r.stderr and last.startswith("error: train.deterministic")
    assert "train.deterministic=false" in last and "scatter_add_cuda_kernel" in last and "more text" not in r.stderr
    assert not torch.are_deterministic_algorithms_enabled()
    assert P.nondeterministic_op_error(RuntimeError("does not have a deterministic implementation")) is None  # off
    assert P.nondeterministic_op_error(ValueError("x")) is None


# torch's message at a cuBLAS call with deterministic algorithms on and the variable unset (ATen/Context.cpp)
CUBLAS_REFUSAL = ("Deterministic behavior was enabled with either `torch.use_deterministic_algorithms(True)` or "
                  "`at::Context::setDeterministicAlgorithms(true)`, but this operation is not deterministic because it "
                  "uses CuBLAS and you have CUDA >= 10.2. To enable deterministic behavior in this case, you must set "
                  "an environment variable before running your PyTorch application: CUBLAS_WORKSPACE_CONFIG=:4096:8 "
                  "or CUBLAS_WORKSPACE_CONFIG=:16:8. For more information, go to "
                  "https://docs.nvidia.com/cuda/cublas/index.html#results-reproducibility")


def test_cublas_workspace_refusal_is_one_line(tmp_path, cache, monkeypatch):
    """cuBLAS refusing a matmul under deterministic algorithms (the variable unset or bad when it was read) ends the
    run with one line naming the variable, its value here and the way out, exit 2, no traceback."""
    import normlab.train.step as L

    def refuse(*a, **k):
        torch.use_deterministic_algorithms(True)
        raise RuntimeError(CUBLAS_REFUSAL + "\nmore text")

    monkeypatch.setattr(L, "lm_loss", refuse)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    r = run_inproc("train", "tiny", *CLI_SMALL, "--set", "train.steps=2", "--out", str(tmp_path / "r"), cache=cache)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr and "more text" not in r.stderr
    assert last.startswith("error: train.deterministic: cuBLAS needs CUBLAS_WORKSPACE_CONFIG=:4096:8")
    assert "':0:0'" in last
    assert "train.deterministic=false" in last and not torch.are_deterministic_algorithms_enabled()
    assert P.nondeterministic_op_error(RuntimeError(CUBLAS_REFUSAL)) is None  # deterministic algorithms off


FIRST_TORCH_IMPORT = """
import os, runpy, sys
class Watch:
    seen = None
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and Watch.seen is None:
            Watch.seen = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "<unset>")
            print("CUBLAS_AT_TORCH_IMPORT=" + Watch.seen, flush=True)
        return None
sys.meta_path.insert(0, Watch())
entry, argv = sys.argv[1], sys.argv[2:]
if argv:
    sys.argv = [entry, *argv]
    runpy.run_module(entry, run_name="__main__", alter_sys=True)
else:
    __import__(entry)
    import torch  # what a caller does next
"""


@pytest.mark.parametrize("entry,args", [
    ("normlab", ["train", "tiny", "--set", "train.steps=2", "--set", "train.eval_every=2", "--set", "diag.every=0"]),
    ("normlab.api", []),  # a script that trains through the library
    ("normlab.experiments.worker", []),  # a sweep worker process (python -m normlab.experiments.worker)
    ("normlab.experiments.executors", []),  # a background sweep's process
    ("normlab.demo", []),
])
def test_cublas_workspace_is_set_before_torch_is_first_imported(entry, args, tmp_path, cache):
    """In every process that may train (the command, a DDP rank and the demo run ``normlab``'s entry; sweep workers,
    background sweeps and scripts import normlab first), ``CUBLAS_WORKSPACE_CONFIG`` is set before torch is first
    imported, so before any CUDA work: watched by an import hook in a fresh interpreter with the variable unset; it
    is still set when the process ends."""
    import subprocess
    import sys

    from tests.helpers import cli_env

    env = {k: v for k, v in cli_env(cache).items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    extra = ["--out", str(tmp_path / "r")] if args else []
    r = subprocess.run([sys.executable, "-c", FIRST_TORCH_IMPORT, entry, *args, *extra], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert P.CUBLAS_WORKSPACE == ":4096:8"  # the value normlab/__init__.py sets
    assert r.stdout.splitlines()[0] == f"CUBLAS_AT_TORCH_IMPORT={P.CUBLAS_WORKSPACE}", r.stdout[:500]
    if args:
        assert summary(tmp_path / "r")["status"] == "completed"


def test_deterministic_key_keeps_old_hashes_and_rejects_non_bools(tmp_path, cache):
    """A config at the default ``train.deterministic: true`` hashes as before the key existed (older runs resume);
    ``false`` is a different run. A value other than true, false or auto is refused in one line."""
    from normlab.config import config_from_dict

    a = config_from_dict({})
    d = a.to_dict()
    d["train"].pop("track"), d["train"].pop("deterministic")
    d["train"].pop("stack"), d["train"].pop("tf32")  # keys that came later, at their defaults
    d["train"].pop("track_required", None)
    d["diag"].pop("probes", None)
    for k in ("residual", "streams", "hc_dynamic", "sinkhorn_iters", "ngpt_alpha_init"):
        d["model"].pop(k)  # the residual-stream keys, later still, at their defaults
    old = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    assert a.hash() == old != config_from_dict({"train": {"deterministic": False}}).hash()
    out = tmp_path / "x"
    assert_bad_input(run_inproc("train", "tiny", "--set", "train.deterministic=maybe", "--out", str(out),
                                cache=cache), "train.deterministic")
    assert not out.exists()


@pytest.mark.parametrize("bad, frag", [("train.precision=fp16", "train.precision"),
                                       ("train.compile=maybe", "train.compile"), ("device=tpu", "device")])
def test_bad_runtime_keys(bad, frag, tmp_path, cache):
    out = tmp_path / "x"
    assert_bad_input(run_inproc("train", "tiny", "--set", bad, "--out", str(out), cache=cache), frag)
    assert not out.exists()


@pytest.mark.slow
def test_bf16_resume_after_kill_9_is_bit_exact(tmp_path, cache):
    args = ["train", "tiny", *CLI_SMALL, "--set", "train.precision=bf16", "--set", "train.steps=16",
            "--set", "train.checkpoint_every=4", "--set", "train.eval_every=8", "--set", "model.dropout=0.1"]
    ref = tmp_path / "ref"
    normlab(*args, "--out", str(ref), cache=cache, check=True)
    out = tmp_path / "killed"
    kill_9_after(args, out, cache, 8)
    assert not (out / "model.safetensors").exists(), "run finished before it could be killed"
    r = normlab("train", "--resume", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    assert summary(out)["precision"] == "bf16"
    assert_same_weights(ref, out)
    assert _losses(ref) == _losses(out)


def test_conversion_of_bf16_run_is_exact_in_fp32(tmp_path, cache):
    run = tmp_path / "run"
    run_inproc("train", "tiny", *CLI_SMALL, "--set", "train.precision=bf16", "--set", "train.steps=4",
               "--out", str(run), cache=cache, check=True)
    out = tmp_path / "conv"
    r = run_inproc("convert", str(run), "--to", "rmsnorm", "--out", str(out), "--json", cache=cache, check=True)
    row = json.loads(r.stdout)
    assert row["max_abs_logit_diff"] <= 1e-4 and abs(row["bpb_after"] - row["bpb_before"]) <= 1e-6
    assert json.loads((out / "conversion.json").read_text())["dtype"] == "float32"


def test_compiled_training_does_not_recompile(tmp_path, cache, monkeypatch):
    """``train.compile: true`` through the training loop (steps, periodic evaluation, checkpoints): dynamo captures the
    model once and never recompiles (no table or cache filled in a forward). Dynamo's guards do not depend on the
    backend, so the test compiles with ``backend="eager"`` (seconds instead of inductor's minutes)."""
    dynamo = pytest.importorskip("torch._dynamo")
    if not dynamo.is_dynamo_supported():
        pytest.skip("torch.compile is not supported on this Python")
    from torch._dynamo.utils import counters

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, backend="eager"))
    dynamo.reset()
    counters.clear()
    cfg = load_config("tiny", [*SMALL, "train.steps=6", "train.eval_every=2", "train.log_every=1",
                               "train.checkpoint_every=3", "train.compile=true", "train.precision=fp32",
                               f"data.cache_dir={cache}"])
    out = tmp_path / "run"
    train(copy.deepcopy(cfg), out, quiet=True)
    assert counters["stats"]["unique_graphs"] == 1 and counters["stats"]["calls_captured"] > 0
    assert not counters["recompiles"] and summary(out)["compile"] is True


def test_cuda_defaults_chosen_blind(monkeypatch):
    """On a (simulated) CUDA device: ``precision: auto`` is bf16 wherever the device supports it, with no timing
    probe (the probe would raise here); fp32 where it lacks bf16; ``train.tf32`` switches TF32 for fp32 matmuls on
    (auto, true) or off (false, strict fp32), on CUDA only, and ``kept_determinism`` restores it; ``deterministic:
    true`` switches deterministic kernels on, stops the NaN fill of new memory, and says so."""
    import torch.utils.deterministic as D

    cfg = load_config("tiny")
    monkeypatch.setattr(P, "_cached_probe", lambda *a: (_ for _ in ()).throw(AssertionError("probed")))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    prec, why = P.resolve_precision(cfg, "cuda")
    assert prec == "bf16" and "no timing probe" in why
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert P.resolve_precision(cfg, "cuda")[0] == "fp32"
    before = (torch.backends.cuda.matmul.allow_tf32, D.fill_uninitialized_memory)
    with P.kept_determinism():
        assert P.use_tf32("cpu", "auto") == ("auto", "")  # a CPU run sets nothing
        assert torch.backends.cuda.matmul.allow_tf32 == before[0]
        on, why = P.use_tf32("cuda", "auto")
        assert on is True and torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "high"
        assert "train.tf32=false" in why
        assert P.use_tf32("cuda", False)[0] is False and not torch.backends.cuda.matmul.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest"
        det, why = P.use_deterministic_kernels("cuda", True)
        assert det and why.startswith("yes (set in the config") and torch.are_deterministic_algorithms_enabled()
        assert not D.fill_uninitialized_memory and "not filled with NaN" in why
        P.use_tf32("cuda", True)
    assert (torch.backends.cuda.matmul.allow_tf32, D.fill_uninitialized_memory) == before
    assert not torch.are_deterministic_algorithms_enabled()


def test_new_runtime_keys_validate_and_keep_cpu_hashes():
    """``train.deterministic`` / ``train.tf32`` take true, false or auto (one-line refusal otherwise); at their
    defaults, and ``train.stack`` at any value, the config hash is the one from before the keys existed."""
    from normlab.errors import NormlabError

    base = load_config("tiny")
    for key in ("deterministic", "tf32"):
        assert load_config("tiny", [f"train.{key}=auto"]).train.validate()
        with pytest.raises(NormlabError, match=f"train.{key} must be auto, true or false"):
            load_config("tiny", [f"train.{key}=maybe"]).validate()
    assert load_config("tiny", ["train.stack=on"]).hash() == load_config("tiny", ["train.stack=off"]).hash() \
        == base.hash()
    assert load_config("tiny", ["train.tf32=false"]).hash() != base.hash()
    d = base.identity_dict()
    assert "stack" not in d["train"] and "tf32" not in d["train"] and "deterministic" not in d["train"]


def _tf32_reads() -> tuple:
    """Every TF32 read: torch's fp32_precision switches and the legacy reads (or "raises")."""
    def read(f):
        try:
            return f()
        except RuntimeError:
            return "raises"
    knobs = {n: P._knob(n).fp32_precision for n in P._KNOBS}
    return knobs, read(torch.get_float32_matmul_precision), read(lambda: torch.backends.cudnn.allow_tf32)


START = {
    "default": lambda: None,
    "legacy": lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
    "new-api": lambda: (setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),
                        setattr(torch.backends.cudnn.conv, "fp32_precision", "ieee")),
    "rnn": lambda: setattr(torch.backends.cudnn.rnn, "fp32_precision", "ieee"),
}


@pytest.mark.parametrize("start", list(START))
def test_tf32_switches_are_set_for_cuda_alone_and_restored_exactly(start):
    """From any state (torch's defaults; TF32 set through the legacy ``allow_tf32``; through the new
    ``fp32_precision`` API alone, where the legacy reads raise; a cuDNN RNN switch set): a (simulated) CUDA run sets
    TF32 with every read consistent (cuDNN's RNN switch with its convolution one, as ``cudnn.allow_tf32`` sets them),
    leaves the CPU's (mkldnn) matmul switch as it was, and
    ``kept_determinism`` restores every switch and read exactly."""
    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision API")
    pristine = _tf32_reads()
    try:
        START[start]()
        before = _tf32_reads()
        with P.kept_determinism():
            assert P.use_tf32("cuda", "auto")[0] is True
            assert torch.get_float32_matmul_precision() == "high" and torch.backends.cuda.matmul.allow_tf32
            assert torch.backends.cudnn.allow_tf32
            during = _tf32_reads()[0]
            assert during["mkldnn.matmul"] == before[0]["mkldnn.matmul"]
            assert P.use_tf32("cuda", False)[0] is False
            assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        assert _tf32_reads() == before
    finally:
        torch.set_float32_matmul_precision(pristine[1])
        torch.backends.cudnn.allow_tf32 = pristine[2]
        for name, value in pristine[0].items():
            P._knob(name).fp32_precision = value
    assert _tf32_reads() == pristine


def test_compile_on_cuda_without_triton_runs_uncompiled(monkeypatch):
    """``train.compile`` auto or true on a CUDA device where inductor has no working triton: uncompiled, with why
    (a compile would fail at the first step)."""
    monkeypatch.setattr(P, "has_triton", lambda: False)
    for value in ("auto", True):
        on, why = P.resolve_compile(value, "cuda")
        assert not on and "no working triton" in why
    monkeypatch.setattr(P, "has_triton", lambda: True)
    assert P.resolve_compile("auto", "cuda") == (True, "auto: on for CUDA")


@pytest.mark.parametrize("damage", ["[" * 100_000 + "]" * 100_000, '{"k": ' + "1" * 5001 + "}", "[1, 2]", "{"])
def test_a_damaged_precision_probe_cache_is_probed_again(damage, tmp_path, monkeypatch):
    """The probe cache is read with the bounded reader: a file nested past json's recursion, holding a 5001-digit
    integer, holding a list or cut short is measured again and rewritten (was a RecursionError / ValueError /
    AttributeError traceback)."""
    import normlab.train.precision as prec

    cfg = load_config("tiny")
    cfg.data.cache_dir = str(tmp_path)
    (tmp_path / "precision_probe.json").write_text(damage)
    monkeypatch.setattr(prec, "probe_step_times", lambda c, d: {"fp32": 1.0, "bf16": 2.0, "ratio": 2.0})
    assert prec._cached_probe(cfg, "cpu") == {"fp32": 1.0, "bf16": 2.0, "ratio": 2.0}
    assert len(json.loads((tmp_path / "precision_probe.json").read_text())) == 1
