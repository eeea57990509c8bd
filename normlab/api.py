"""normlab's Python API: the entry points ``import normlab`` exposes (docs/api.md).

    >>> import normlab
    >>> cfg = normlab.make_config("tiny", {"model.norm": "rmsnorm", "train.steps": 20})   # doctest: +SKIP
    >>> model = normlab.build_model(cfg)                        # a GPT (torch.nn.Module), seeded init
    >>> summary = normlab.train_run(cfg, "runs/api-demo")         # the run directory `normlab train` writes
    >>> run = normlab.load_run("runs/api-demo")                 # .model (eval mode), .cfg, .tokenizer, .data()
    >>> normlab.evaluate(run)["bpb"]                  # as `normlab eval RUN_DIR --json`
    >>> normlab.generate(run, "def ", max_new_tokens=20, temperature=0)
    >>> normlab.compare({"base": "tiny", "variants": [...]}, "runs/sweep")   # as `normlab compare`

Everything here is a thin layer over the modules the CLI uses, so results are the CLI's; errors are
``normlab.NormlabError`` (one line, the CLI's message). The names avoid ``normlab.train`` and ``normlab.config``:
those are normlab's own modules (a function of that name would be replaced by the module on its first import).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from normlab.config import RunConfig, new_config, read_yaml, resolve_config_path
from normlab.errors import NormlabError
from normlab.io import MAX_INT_DIGITS
from normlab.eval.documents import validation_prompt
from normlab.eval.lm import evaluate as _evaluate
from normlab.eval.sampling import check_sampling_args, generate_tokens
from normlab.experiments.entry import run as run_sweep
from normlab.experiments.replication import check_replication_data, replica_dir, replication_sweep
from normlab.experiments.sweepdir import default_sweep_dir
from normlab.experiments.sweep import list_presets, load_sweep, parse_sweep
from normlab.model import build_model as _build
from normlab.report import write_report
from normlab.report.sequential import record_replication
from normlab.rundir.files import CONFIG_FILE
from normlab.rundir.readers import check_context, open_config, run_data, run_tokenizer
from normlab.rundir.readers import load_run as _load
from normlab.stats.learning import learning_record
from normlab.train.loop import train as _train
from normlab.validate import SPLITS, check_arg, shown


def make_config(base: str | Path | dict[str, Any] | RunConfig | None = None,
           overrides: dict[str, Any] | list[str] | None = None) -> RunConfig:
    """A validated run config: ``base`` is a preset name (``"tiny"``), a YAML path, a nested dict of sections, a
    RunConfig, or None (all defaults); ``overrides`` are dotted keys (``{"model.norm": "rmsnorm"}``, or the CLI's
    ``["model.norm=rmsnorm"]``), checked like ``--set``."""
    if isinstance(base, RunConfig):
        data = base.to_dict()
    elif isinstance(base, dict):
        data = base  # new_config copies it
    elif base is None:
        data = {}
    else:
        data = read_yaml(resolve_config_path(str(base)))
    _check_values(data)  # string overrides are read by the CLI's bounded YAML reader; others by _yaml_scalar
    items = (overrides if isinstance(overrides, list) or overrides is None
             else [f"{k}={_yaml_scalar(k, v)}" for k, v in overrides.items()])
    return new_config(data, items)


def _yaml_scalar(key: str, v: Any) -> str:
    """An override's value as the text ``--set KEY=VALUE`` would carry: what cannot be written is one line."""
    if isinstance(v, str):
        return v
    _check_values({key: v})
    return json.dumps(v)


def _check_values(data: Any, where: str = "") -> None:
    """Every value of a config mapping is a YAML scalar (str, int, float, bool, None) or a list / mapping of them,
    its integers at most MAX_INT_DIGITS digits (what the CLI's YAML reader accepts); anything else is one line
    naming the key (``object()`` was a TypeError, ``10**5000`` a ValueError)."""
    stack = [(where, data)]
    while stack:
        key, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{key}.{k}" if key else str(k), x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{key}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**MAX_INT_DIGITS:
            raise NormlabError(f"{key}: {shown(v)}; numbers normlab reads have at most {MAX_INT_DIGITS} digits")
        elif not (v is None or isinstance(v, (str, int, float, bool))):
            raise NormlabError(f"{key}: a value of type {type(v).__name__} is not a config value (give a string, "
                               "number, boolean, null, or a list or mapping of them)")


def _as_config(cfg: str | Path | dict[str, Any] | RunConfig) -> RunConfig:
    return cfg if isinstance(cfg, RunConfig) else make_config(cfg)


def build_model(cfg: str | Path | dict[str, Any] | RunConfig, *, seed: int | None = None):
    """The untrained model of a config (a ``normlab.model.GPT``), initialised under ``seed`` (default the config's
    ``seed``), exactly as ``train`` initialises it. ``model.vocab_size`` is the config's (256 for bytes)."""
    check_arg("seed", seed, optional=True)  # as `--set seed=`: an integer in [0, 2**63 - 1]
    cfg = _as_config(cfg)
    torch.manual_seed(cfg.seed if seed is None else seed)
    return _build(cfg.model)


def train_run(cfg: str | Path | dict[str, Any] | RunConfig, out: str | Path, *, resume: bool = False,
          quiet: bool = True) -> dict[str, Any]:
    """Train into the run directory ``out`` (new; or ``resume=True`` to continue it) and return ``summary.json``'s
    dict (``status``: completed / diverged / interrupted). Same files as ``normlab train``, TensorBoard included."""
    out = Path(out)
    if resume:
        return _train(open_config(out), out, resume=True, quiet=quiet)
    if (out / CONFIG_FILE).exists():
        raise NormlabError(f"{out} already holds a run; pass resume=True or another directory")
    return _train(_as_config(cfg), out, resume=False, quiet=quiet)


@dataclass
class Run:
    """A trained run: ``model`` (eval mode), ``cfg``, ``run_dir``, ``weights``; ``tokenizer`` and ``data()`` come
    from the run directory (its own tokenizer.json; the corpus checked against data.json)."""

    run_dir: Path
    cfg: RunConfig
    model: Any
    weights: Path

    @property
    def tokenizer(self):
        return run_tokenizer(self.run_dir, self.cfg)

    def data(self, source: str | None = None):
        """The tokenized splits (``PreparedData``): the run's corpus, or ``source`` with the run's tokenizer."""
        return run_data(self.run_dir, self.cfg, source=source)


def load_run(run_dir: str | Path) -> Run:
    """Open a run directory (final weights, or the last checkpoint of an unfinished run)."""
    r = _load(run_dir)
    return Run(Path(run_dir), r.cfg, r.model, r.weights)


def _as_run(run: Run | str | Path) -> Run:
    return run if isinstance(run, Run) else load_run(run)


def evaluate(run: Run | str | Path, *, split: str = "val", data: str | None = None, context: int | None = None,
             stride: int | None = None, max_tokens: int | None = None, batch_size: int = 16) -> dict[str, Any]:
    """Loss (nats/token), ``bpb`` (bits/byte), token/byte/word perplexity and counts, the corpus's unigram level
    (``unigram_bpb``, ``unigram_byte_perplexity``) and ``did_not_learn`` (normlab.stats.learning), as ``normlab
    eval --json`` (nothing is written). ``split``: ``val``, ``test`` or ``all`` (the whole corpus); ``data``: score
    another corpus with the run's tokenizer."""
    if split not in SPLITS:
        raise NormlabError(f"split must be one of {', '.join(SPLITS)}, got {shown(split)}")
    for name, value in (("context", context), ("stride", stride), ("max_tokens", max_tokens)):
        check_arg(name, value, optional=True)  # the bounds of `normlab eval`'s flags (normlab.validate.ARG_BOUNDS)
    check_arg("batch_size", batch_size)
    run = _as_run(run)
    ctx = context or run.cfg.model.context
    check_context(run.cfg.model, ctx)
    d = run_data(run.run_dir, run.cfg, source=data, need_window=(),  # scoring: any file of 2 tokens or more
                 whole_ok=split == "all")
    m = _evaluate(run.model, d.split(split), d.token_bytes, d.tokenizer.decode_bytes, context=ctx, stride=stride,
                  batch_size=batch_size, max_tokens=max_tokens or None)  # 0: all, as the CLI
    m.update({"split": split, "split_bytes": d.bytes_of(split), "context": ctx, "stride": stride or ctx})
    if d.entropy_floor_bpb is not None:
        m["entropy_floor_bpb"] = d.entropy_floor_bpb
        m["gap_bpb"] = m["bpb"] - d.entropy_floor_bpb
    m.update(learning_record(m["bpb"], d.unigram_bpb))  # unigram_bpb, its byte perplexity, did_not_learn
    return m


def generate(run: Run | str | Path, prompt: str | None = None, *, max_new_tokens: int = 200, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
             top_nsigma: float | None = None, seed: int = 0) -> str:
    """The sampled continuation of ``prompt`` (text, without the prompt), as ``normlab generate`` would stream it.
    ``temperature=0`` is greedy. ``prompt=None``: as the command, the beginning of a validation document of the
    run's own corpus (``normlab.eval.documents.validation_prompt``)."""
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "top_nsigma": top_nsigma}
    check_sampling_args(**sampling)
    check_arg("max_new_tokens", max_new_tokens)  # as `normlab generate --max-new-tokens`: at most 100,000
    check_arg("seed", seed)
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise NormlabError("prompt must be a non-empty string")
    run = _as_run(run)
    tok = run.tokenizer
    if prompt is None:
        prompt = validation_prompt(run.run_dir, run.cfg, seed)[0]
    ids = tok.encode_prompt(prompt)
    use_cache = hasattr(run.model, "step") and hasattr(run.model, "init_state")
    gen = torch.Generator().manual_seed(seed)
    out = list(generate_tokens(run.model, ids, max_new_tokens, context=run.cfg.model.context, use_cache=use_cache,
                               generator=gen, **sampling))
    return tok.decode(out)


def compare(sweep: str | Path | dict[str, Any], out: str | Path | None = None, *, workers: int | None = None,
            report: bool = True) -> dict[str, Any]:
    """Run a sweep (a sweep file, a preset name, or a sweep mapping as in docs/compare.md) in parallel worker
    processes into ``out`` (default ``runs/compare-<name>``) and write its report; returns ``status``, ``counts``,
    ``runs`` (the stored rows), and with ``report`` the ``ranking`` / ``summary`` / report paths."""
    if isinstance(sweep, dict):
        s = parse_sweep(sweep, here=Path.cwd())
    elif not Path(sweep).is_file() and str(sweep) in list_presets():
        s = load_sweep(preset=str(sweep))
    else:
        s = load_sweep(sweep)
    sweep_dir = Path(out) if out else default_sweep_dir(s)
    # a replication (``replicate:``): built and its data checked before anything trains, as ``compare`` does
    replicas = [(src, replication_sweep(s, src), replica_dir(src)) for src in [s.resolved.replicate] if src]
    for _, r, _ in replicas:
        check_replication_data(r)
    # a sequential plan: seeds in rounds until decided (normlab.decide.looks)
    outcome = run_sweep(s, sweep_dir, workers=workers)
    res: dict[str, Any] = {"sweep_dir": str(sweep_dir), "sweep": s.name, "status": outcome.status,
                           "counts": outcome.counts(), "trained": outcome.trained, "skipped": outcome.skipped,
                           "runs": outcome.runs}
    if outcome.until_decided is not None:
        res["until_decided"] = outcome.until_decided
    reps = []
    for src, r, rel in replicas:
        if outcome.status == "interrupted":
            break
        record_replication(sweep_dir, src, rel)
        routcome = run_sweep(r, sweep_dir / rel, workers=workers)
        reps.append({"source": src, "sweep_dir": str(sweep_dir / rel), "status": routcome.status,
                     "sequential": routcome.until_decided})
        outcome.status = res["status"] = routcome.status
        if report and routcome.status != "interrupted":
            write_report(sweep_dir / rel)
    if replicas:
        res["replications"] = reps
    if report and outcome.status != "interrupted":
        rep = write_report(sweep_dir)
        res.update({"report_html": rep["html"], "report_md": rep["md"], "ranking": rep["ranking"],
                    "summary": rep["summary"], "sequential": rep["sequential"], "replication": rep["replication"]})
    return res
