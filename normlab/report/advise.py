"""``normlab advise``: what the stored evidence decides for the model a user intends to train, and how far away it
was measured.

Inputs: the target model (a ``RunConfig``: width, depth, context, tokens, optimizer, precision), the packaged claims
evidence (``normlab.report.evidence``), the packaged scaling fits (``normlab.report.scaling_evidence``: whether they
reach the target -- not degenerate, within their forecast horizon, along the target's tokens per parameter) and the
user's sweep directories (``--from``). Per decision (``DECISIONS``) each claim is sorted into **decided** (the
claims suite's verdict held, not held or within margin, by its own rules, of a definition not revised after a
verdict on the same seeds: a revised one is exploratory), **undecided** or **not observable**, with
the scale it was measured at and its distance from the target (a factor in non-embedding parameters and in training
tokens; ``FAR`` = 10x either way is marked). A decision is stated only as the evidence states it, at its own scale;
nothing is extrapolated. Comparisons from ``--from`` sweeps are shown at equal steps and at equal training FLOPs
(normlab.model.flops; the validation curve interpolated at the pair's common cumulative FLOPs), exploratory, with
the in-context probes their runs stored (``diag.probes``; normlab.report.probes) per variant.

The next question (``next_question``): among the claims with a sweep recipe (``RECIPES``), the most valuable open
one at the target's scale, by this stated rule: a claim whose replications disagree (contested) first, then one
decided at the suite's scale but measured more than ``FAR`` away, then an undecided one; ties by the suite's
|effect| / interval half-width. Its sweep YAML (``normlab compare`` format) is written with an estimated time from
the FLOPs count and a measured rate (a run's own tokens/s x FLOPs/token when one is given, else a local GEMM).
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from normlab.config import RunConfig, stored_config
from normlab.decide.evidence import (
    CONTESTED,
    DECIDED,
    DECIDED_ELSEWHERE,
    FAR,
    NOT_OBSERVABLE_STATUS,
    RULE,
    UNDECIDED,
    record,
    scale_status,
    suite_status,
    sureness,
)
from normlab.errors import NormlabError, printable
from normlab.experiments.claims.docs import seed_span
from normlab.experiments.sweep import parse_sweep
from normlab.io import write_text
from normlab.model import build_model
from normlab.model.config import ModelConfig
from normlab.model.flops import count_flops
from normlab.report import probes, rundirs
from normlab.report.analysis import load as load_sweep_report
from normlab.report.equal_flops import compare_runs
from normlab.report.scaling_evidence import reach

ALPHA = 0.05
DECISIONS: list[tuple[str, tuple[str, ...]]] = [
    ("hidden-state norm", ("dyt-vs-ln", "derf-vs-ln", "derf-vs-dyt", "powernorm-lm", "exact-conversion",
                           "ln-removal")),
    ("placement", ("peri-lr-sensitivity", "postln-lr-sensitivity", "mixln-lr-best", "mixln-grad", "cod-growth",
                   "cod-lns", "peri-variance", "peri-variance-magnitude", "peri-massive", "postln-warmup",
                   "deepnorm-deep-post")),
    ("residual stream", ("hc-vs-pre", "hc-vs-pre-flops", "mhc-composite-gain", "hc-lr-sensitivity",
                         "ngpt-fewer-steps")),
    ("QK-norm / softcap", ("qk-lr-sensitivity", "tev-instability")),
    ("attention normalization", ("lssar-extrapolation", "lssar-eval-only", "linear-attention",
                                 "transnormer-vs-linear")),
    ("output norm", ("zloss-logit-divergence", "stablemax-collapse")),
    ("optimizer / clipping", ("warmup-lr-sensitivity", "adagc-lr-sensitivity", "adagc-spikes")),
]
"""Which claims (docs/claims.md) bear on which choice a user makes; claims about conversion, quantization and
label-free scores are in docs/claims.md and not advice about training."""

PRE = ("Pre-LN", {"model.placement": "pre"})
RECIPES: dict[str, dict[str, Any]] = {
    "peri-lr-sensitivity": {"baseline": PRE, "variant": ("Peri-LN", {"model.placement": "peri"}),
                            "primary": "lr_sensitivity"},
    "qk-lr-sensitivity": {"baseline": PRE, "variant": ("Pre-LN + QK-norm", {"model.placement": "pre",
                                                                            "model.qk_norm": True}),
                          "primary": "lr_sensitivity"},
    "postln-lr-sensitivity": {"baseline": PRE, "variant": ("Post-LN", {"model.placement": "post"}),
                              "primary": "lr_sensitivity"},
    "mixln-lr-best": {"baseline": PRE, "variant": ("Mix-LN", {"model.placement": "mix"}), "primary": "best_loss"},
    "dyt-vs-ln": {"baseline": ("LayerNorm", {"model.norm": "layernorm"}), "variant": ("DyT", {"model.norm": "dyt"}),
                  "primary": "best_loss"},
    "derf-vs-ln": {"baseline": ("LayerNorm", {"model.norm": "layernorm"}),
                   "variant": ("Derf", {"model.norm": "derf"}), "primary": "best_loss"},
    "hc-vs-pre": {"baseline": PRE, "variant": ("HC", {"model.placement": "pre", "model.residual": "hc",
                                                      "model.streams": 4}), "primary": "best_loss"},
}
"""The claims ``normlab compare`` can decide as a declared question (a two-variant sweep over a learning-rate
grid), with their variants as config overrides."""
LR_GRID = {"min": 0.001, "max": 0.3, "points": 5}  # the demo's grid (normlab/configs/sweeps/quick.yaml)
SEED_RANGE = range(8000, 9000)  # the next question's seeds: no shipped question uses them (tests/experiments/)
SEED_BLOCK = 4  # seeds per next question: the first block of the range that no stored evidence used
SCALE_RE = re.compile(r"width (\d+), (\d+) blocks, (\d+) steps, ([\d.]+)([km]?) tokens")


# ------------------------------------------------------------------------------------------------ scale and distance
def non_embedding_params(mc: ModelConfig) -> int:
    """Non-embedding parameters of the model ``mc`` builds (built on the meta device: no memory)."""
    with torch.device("meta"):
        return build_model(mc).num_params(non_embedding=True)


def parse_scale(text: str | None) -> list[dict[str, int]]:
    """``"width 64, 4 blocks, 500 steps, 512k tokens; ..."`` -> ``[{width, depth, steps, tokens}]`` (k = 1000)."""
    out = []
    for m in SCALE_RE.finditer(text or ""):
        mult = {"": 1, "k": 1000, "m": 1000_000}[m.group(5)]
        out.append({"width": int(m.group(1)), "depth": int(m.group(2)), "steps": int(m.group(3)),
                    "tokens": int(round(float(m.group(4)) * mult))})
    return out


def distance(target: dict[str, Any], scale: dict[str, int], suite: dict[str, Any]) -> dict[str, Any]:
    """Factors target / measured in non-embedding parameters and training tokens; ``far``: either beyond ``FAR``."""
    mc = ModelConfig(width=scale["width"], depth=scale["depth"], heads=suite.get("heads") or 4,
                     context=suite.get("context") or 64)
    n = non_embedding_params(mc)
    fp, ft = target["params"] / n, target["tokens"] / scale["tokens"]
    return {"params": n, "tokens": scale["tokens"], "params_factor": fp, "tokens_factor": ft,
            "far": max(fp, 1 / fp, ft, 1 / ft) > FAR}


def _nearest(target: dict[str, Any], scales: list[dict[str, int]], suite: dict[str, Any]) -> dict[str, Any] | None:
    ds = [distance(target, s, suite) for s in scales]
    return min(ds, key=lambda d: abs(math.log(d["params_factor"])) + abs(math.log(d["tokens_factor"])), default=None)


# ------------------------------------------------------------------------------------------------------ the claims
def status(claim: dict[str, Any]) -> str:
    """The suite's own verdict as a status (normlab.decide.evidence.suite_status: advise re-tests nothing)."""
    return suite_status(claim)


def corpora(claim: dict[str, Any], reps: list[dict[str, Any]], suite: dict[str, Any]) -> dict[str, list[str]]:
    """``decided_on``: the suite's corpus when it decided the claim; ``replicated_on`` / ``contradicted_on`` /
    ``undecided_on``: the replications (their own seed blocks) that decided on the claim's side / decided against
    it / decided nothing (an undecided replication, often underpowered, is no evidence either way)."""
    seeds = claim.get("seeds")
    block = f"seeds {seed_span(seeds)}" if isinstance(seeds, list) and seeds else f"{suite.get('seeds')} seeds"
    on = [f"{suite.get('corpus')} (claims suite, {block})"] if status(claim) == DECIDED else []
    out: dict[str, list[str]] = {"replicated_on": [], "contradicted_on": [], "undecided_on": []}
    for r in reps:
        side = r.get("claim_side")
        key = "replicated_on" if side else "contradicted_on" if side is False else "undecided_on"
        power = f", power {r['power']:.2f}" if isinstance(r.get("power"), (int, float)) else ""
        out[key].append(f"{r['corpus']} (seeds {r['seeds'][0]}-{r['seeds'][-1]}{power})")
    return {"decided_on": on, **out}


def _claim_entry(c: dict[str, Any], target: dict[str, Any], ev: dict[str, Any]) -> dict[str, Any]:
    suite = ev["suite"]
    reps = [r for r in ev["replications"] if r["claim"] == c["name"]]
    dist = _nearest(target, parse_scale(c.get("scale")), suite)
    st = status(c)
    ci = c.get("ci") or [None, None]
    verdict = c["verdict"] + (", exploratory: revised after a verdict on these seeds" if c.get("exploratory") else "")
    before = c.get("exploratory_result")
    if before:  # confirmed on a fresh seed block: the exploratory verdict on the seeds its revision saw beside it
        verdict += (f" on seeds {seed_span(c['seeds'])}, a fresh block (on seeds {seed_span(before['seeds'])}, "
                    f"which its revision saw: {before['verdict']}, exploratory)")
    for other in c.get("exploratory_elsewhere") or []:  # a fresh block a revision saw as well: no confirmation
        verdict += (f"; on seeds {seed_span(other['seeds'])}, also seen by its revision: {other['verdict']}, "
                    "exploratory")
    superseded = c.get("superseded_confirmation")
    if superseded:  # a follow-up on a larger fresh block: the 5-seed confirmation it supersedes beside it
        verdict += (f"; superseding the confirmation on seeds {seed_span(superseded['seeds'])}: "
                    f"{superseded['verdict']}")
    entry = {"name": c["name"], "claim": c["claim"], "paper": c["paper"], "metric": c["metric"],
             "verdict": verdict, "measured": c["measured"], "ci95": ci, "p_holm": c.get("p_adj"),
             "n": c.get("n"), "scale": c.get("scale"), "corpus": suite.get("corpus"),
             **corpora(c, reps, suite), "replications": reps, "distance": dist}
    # the claim's record under the decision layer's rule (the suite with its replications), then its scale
    rec = record(c, entry["replicated_on"], entry["contradicted_on"])
    st, text = scale_status(rec["status"], None if dist is None else dist["far"], c.get("scale"))
    entry.update(status=st, status_text=text, basis=rec["basis"], contested=rec["contested"])
    if st == DECIDED:
        entry["applies"] = "measured within 10x of your model"
    elif st == DECIDED_ELSEWHERE:
        entry["applies"] = "measured more than 10x away from your model (or at an unknown scale): not evidence at yours"
    else:
        entry["applies"] = "no decision at any measured scale"
    return entry


def decisions(target: dict[str, Any], ev: dict[str, Any]) -> list[dict[str, Any]]:
    """Per decision: the claims bearing on it split by status, and the FLOPs cost of each recipe's variant."""
    by_name = {c["name"]: c for c in ev["claims"]}
    out = []
    for title, names in DECISIONS:
        entries = [_claim_entry(by_name[n], target, ev) for n in names if n in by_name]
        out.append({"decision": title,
                    "sure": sureness([e["status"] for e in entries]),
                    "decided": [e for e in entries if e["status"] == DECIDED],
                    "decided_elsewhere": [e for e in entries if e["status"] == DECIDED_ELSEWHERE],
                    "undecided": [e for e in entries if e["status"] in (UNDECIDED, CONTESTED)],
                    "not_observable": [e for e in entries if e["status"] == NOT_OBSERVABLE_STATUS]})
    return out


def recipe_costs(cfg: RunConfig) -> list[dict[str, Any]]:
    """Training FLOPs per token of each recipe's variant vs its baseline at the target's shape."""
    rows = []
    for name, r in RECIPES.items():
        (bn, bset), (vn, vset) = r["baseline"], r["variant"]
        fb = count_flops(_with(cfg.model, bset)).training
        fv = count_flops(_with(cfg.model, vset)).training
        rows.append({"claim": name, "baseline": bn, "variant": vn, "baseline_flops_per_token": fb,
                     "variant_flops_per_token": fv, "ratio": fv / fb})
    return rows


def _with(mc: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    d = dict(mc.__dict__)
    d.update({k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("model.")})
    return ModelConfig(**d)


# --------------------------------------------------------------------------------- sweeps at equal steps and FLOPs
def _config_flops(info: Any) -> float | None:
    """Training FLOPs per token counted from a run's stored config (runs older than the summary field)."""
    cfg = info.row.get("config")
    if not isinstance(cfg, dict):
        return None
    return count_flops(stored_config(cfg, f"sweep run {info.row.get('run_id')}").model).training


def sweep_comparisons(sweep_dir: Path, baseline: str | None = None) -> dict[str, Any]:
    """Each variant of a sweep directory against ``baseline`` (default: its first variant) at equal steps and at
    equal FLOPs (normlab.report.equal_flops)."""
    runs = [info for info, _ in rundirs.collect([sweep_dir])]
    res = compare_runs(runs, baseline, _config_flops)
    if res["baseline"] is None:
        raise NormlabError(f"{sweep_dir}: no completed runs to compare")
    if baseline is not None and res["baseline"] != baseline:
        raise NormlabError(f"{sweep_dir}: baseline {baseline!r} is not a variant with completed runs")
    table, missing = probes.rows(load_sweep_report(sweep_dir)) if (sweep_dir / "results.sqlite").is_file() else ([], [])
    return {"sweep": str(sweep_dir), **res, "probes": table, "probes_missing": missing}


# ------------------------------------------------------------------------------------------------- the next sweep
def next_question(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The claim with a recipe ranked first by the module docstring's rule."""
    def tier(e: dict[str, Any]) -> tuple[int, float]:
        lo, hi = (e["ci95"] or [None, None])[:2]
        half = (hi - lo) / 2 if lo is not None and hi is not None else None
        signal = abs(e["measured"]) / half if half else 0.0
        far = e["distance"] is None or e["distance"]["far"]
        t = 0 if e["contested"] else 1 if e["status"] == DECIDED_ELSEWHERE or (e["status"] == DECIDED and far) \
            else 2 if e["status"] != DECIDED else 3
        return t, -signal

    cands = sorted((e for e in entries if e["name"] in RECIPES), key=tier)
    if not cands:
        return None
    e = cands[0]
    why = {0: "its evidence disagrees (the suite with its replications, or the replications)",
           1: "decided only at a scale more than 10x from yours",
           2: "undecided at every measured scale", 3: "decided within 10x of your scale"}[tier(e)[0]]
    return {"claim": e["name"], "why": why, "rule": "contested > decided far away > undecided; ties by the suite's "
            "|effect| / interval half-width"}


def next_seeds(ev: dict[str, Any]) -> list[int]:
    """The first block of ``SEED_BLOCK`` seeds in ``SEED_RANGE`` that no stored replication ran on (a next question
    that was run and packaged, ``docs/replications-advise-*.json``, is asked again on fresh seeds)."""
    used = {s for r in ev["replications"] for s in r["seeds"]}
    for start in range(SEED_RANGE.start, SEED_RANGE.stop - SEED_BLOCK + 1, SEED_BLOCK):
        block = list(range(start, start + SEED_BLOCK))
        if not used.intersection(block):
            return block
    raise NormlabError(f"every seed block of {SEED_RANGE.start}-{SEED_RANGE.stop - 1} is in the stored evidence")


def sweep_yaml(claim: str, cfg: RunConfig, base: str | dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    """The ``normlab compare`` sweep that decides ``claim`` at ``cfg``'s shape: its recipe's two variants over the
    demo's learning-rate grid, ``seeds`` (:func:`next_seeds`), Holm over a family of one."""
    r = RECIPES[claim]
    (bn, bset), (vn, vset) = r["baseline"], r["variant"]
    m, t = cfg.model, cfg.train
    return {
        "name": f"advise-{claim}",
        "description": f"decides {claim} (docs/claims.md) at width {m.width}, {m.depth} blocks, context {m.context}, "
                       f"{t.steps} steps of {t.batch_size} sequences; written by normlab advise",
        "base": base, "baseline": bn, "primary": r["primary"], "family": [vn], "alpha": ALPHA, "correction": "holm",
        "set": {"model.width": m.width, "model.depth": m.depth, "model.heads": m.heads, "model.context": m.context,
                "train.steps": t.steps, "train.batch_size": t.batch_size, "train.precision": t.precision,
                "optim.name": cfg.optim.name, "train.warmup_steps": max(1, t.steps // 10),
                "train.eval_every": t.steps, "train.checkpoint_every": t.steps},
        "lr_grid": dict(LR_GRID),
        "variants": [{"name": bn, "set": dict(bset)}, {"name": vn, "set": dict(vset)}],
        "seeds": list(seeds),
    }


SWEEP_HEADER = "# the next question's sweep, written by normlab advise (normlab compare THIS_FILE runs it)"


def write_sweep(spec: dict[str, Any], path: Path) -> Path:
    """Write ``spec`` as YAML to ``path`` (parsed back by ``normlab.experiments.sweep.load_sweep`` first: a spec
    ``normlab compare`` would refuse is never written), atomically, under ``SWEEP_HEADER``. A file already there is
    replaced only when advise wrote it (its first line is the header): a user's own file is never overwritten."""
    parse_sweep(spec, source=str(path))
    if path.exists() or path.is_symlink():
        first = ""
        if path.is_file():
            with open(path, "rb") as f:
                first = f.readline(len(SWEEP_HEADER) + 2).decode("utf-8", "replace").rstrip("\r\n")
        if first != SWEEP_HEADER:
            raise NormlabError(f"--write {printable(str(path))} exists and was not written by normlab advise; give "
                               "another path, or --no-write")
    write_text(path, SWEEP_HEADER + "\n" + yaml.safe_dump(spec, sort_keys=False))
    return path


def gemm_rate(precision: str = "fp32", size: int = 1024, seconds: float = 0.3) -> float:
    """Measured FLOP/s of a ``size x size`` matmul on this machine's CPU (fp32, or bf16 when asked)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    return 2.0 * size ** 3 * n / (time.perf_counter() - t0)


def estimate(claim: str, n_seeds: int, cfg: RunConfig, rate: float) -> dict[str, Any]:
    """Runs, tokens, training FLOPs and seconds at ``rate`` FLOP/s of the sweep that decides ``claim`` on ``n_seeds``
    seeds (:func:`sweep_yaml`)."""
    r = RECIPES[claim]
    runs = 2 * LR_GRID["points"] * n_seeds
    tokens = cfg.train.steps * cfg.train.batch_size * cfg.train.grad_accum * cfg.model.context
    flops = sum(count_flops(_with(cfg.model, s)).training for _, s in (r["baseline"], r["variant"]))
    total = flops / 2 * runs * tokens
    return {"runs": runs, "tokens_per_run": tokens, "flops": total, "rate_flops_per_s": rate,
            "seconds_here": total / rate, "gpu": "not measured"}


# ------------------------------------------------------------------------------------------------------ the answer
def target_record(cfg: RunConfig) -> dict[str, Any]:
    """The target model's shape, non-embedding parameters, training tokens and FLOPs per token."""
    m, t = cfg.model, cfg.train
    return {"width": m.width, "depth": m.depth, "heads": m.heads, "context": m.context, "vocab_size": m.vocab_size,
            "norm": m.norm, "placement": m.placement, "steps": t.steps, "batch_size": t.batch_size,
            "tokens": t.steps * t.batch_size * t.grad_accum * m.context, "optimizer": cfg.optim.name,
            "precision": t.precision, "params": non_embedding_params(m),
            "flops_per_token": count_flops(m).training}


def scaling_record(target: dict[str, Any], sc: dict[str, Any]) -> dict[str, Any]:
    """The packaged scaling fits as advise states them: provenance, per variant the fit and whether it is
    degenerate, and whether the fits reach the target (``scaling_evidence.reach``)."""
    return {"points": sc["points"], "command": sc["command"], "date": sc["date"], "corpus": sc["corpus"],
            "metric": sc["metric"], "question": sc["question"], "n_min": sc["n_min"], "n_max": sc["n_max"],
            "tokens_per_param_fitted": sc["tokens_per_param"], "horizon": sc["horizon"],
            "fits": {k: {"params": f["params"], "degenerate": f["degenerate"], "issues": f["issues"]}
                     for k, f in sc["fits"].items()},
            **reach(target["params"], target["tokens"], sc)}


def advise(cfg: RunConfig, ev: dict[str, Any], *, from_dirs: list[Path] = (), baseline: str | None = None,
           rate: float, rate_source: str, sweep_path: Path | None, base: str | dict[str, Any],
           scaling: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole answer as one JSON-able object (module docstring); writes the next sweep to ``sweep_path``."""
    target = target_record(cfg)
    decs = decisions(target, ev)
    entries = [e for d in decs for part in ("decided", "decided_elsewhere", "undecided", "not_observable")
               for e in d[part]]
    nxt = next_question(entries)
    if nxt is not None:
        seeds = next_seeds(ev)
        spec = sweep_yaml(nxt["claim"], cfg, base, seeds)
        nxt["estimate"] = estimate(nxt["claim"], len(seeds), cfg, rate) | {"rate_source": rate_source}
        if sweep_path is not None:
            nxt["sweep_file"] = str(write_sweep(spec, sweep_path))
            nxt["command"] = f"normlab compare {sweep_path}"
        nxt["sweep"] = spec
    follows = {c["source"]: c["follows"] for c in ev["suite"].get("confirmations") or [] if c.get("follows")}
    return {"target": target, "evidence": {**ev["sources"], "corpus": ev["suite"]["corpus"],
                                           "suite_command": ev["suite"]["command"],
                                           **({"follow_ups": follows} if follows else {})},
            "scaling_fits": None if scaling is None else scaling_record(target, scaling),
            "far_factor": FAR, "rule": RULE, "decisions": decs, "costs": recipe_costs(cfg),
            "sweeps": [sweep_comparisons(Path(d), baseline) for d in from_dirs], "next": nxt}


def _g(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}g}"


def _factor(f: float) -> str:
    return f"{f:.3g}x" if f >= 0.95 else f"1/{1 / f:.3g}x"


def render(res: dict[str, Any]) -> str:
    """The answer as text (what ``normlab advise`` prints)."""
    t = res["target"]
    follows = res["evidence"].get("follow_ups") or {}
    lines = [f"Your model: width {t['width']}, {t['depth']} blocks, {t['heads']} heads, context {t['context']}, "
             f"vocab {t['vocab_size']} (assumed from the config's tokenizer; --vocab-size sets it); "
             f"{t['params'] / 1e6:.3g}M non-embedding parameters; {t['tokens']:.3g} "
             f"training tokens ({t['steps']} steps x {t['batch_size']}); {t['optimizer']}, precision "
             f"{t['precision']}; {t['flops_per_token']:.3g} training FLOPs/token (normlab.model.flops).",
             f"Evidence: {res['evidence']['claims']} (corpus {res['evidence']['corpus']}), "
             + "".join(f"{c} (a follow-up of {follows[c]} on a larger fresh block, superseding it for its claims), "
                       if c in follows else f"{c} (the revised claims on a fresh seed block), "
                       for c in res["evidence"].get("confirmations") or [])
             + ", ".join([res['evidence']['replications'], *(res["evidence"].get("more_replications") or [])])
             + ".", *_scaling_lines(res["scaling_fits"])]
    near = [e for d in res["decisions"] for e in d["decided"]]
    lines += ["", "Bottom line (per choice: how sure, and where it was measured; the rule: "
              f"{res.get('rule', '')}):"]
    for d in res["decisions"]:
        top = (d["decided"] or d.get("decided_elsewhere") or [None])[0]
        said = "no decided evidence" if top is None else \
            f"{top['claim']} -- {top['verdict'].split(',')[0]} ({top['status_text']})"
        lines.append(f"  {d['decision']}: {d.get('sure', 'unknown')}: {said}")
    lines += ["", f"{len(near)} decided claim(s) were measured within 10x of your model in parameters and tokens"
              + ("" if near else ": nothing below is decided at your scale; each line states what was decided at "
                 "its own scale"), ""]
    for d in res["decisions"]:
        lines.append(f"== {d['decision']}")
        for e in d["decided"]:
            dist = e["distance"]
            far = f"params {_factor(dist['params_factor'])}, tokens {_factor(dist['tokens_factor'])} of measured" \
                if dist else "scale unknown"
            lines.append(f"  decided: {e['name']} -- {e['claim']}: {e['verdict']}, {_g(e['measured'])} "
                         f"[{_g(e['ci95'][0])}, {_g(e['ci95'][1])}], Holm p {_g(e['p_holm'])}, n {e['n']}")
            lines.append(f"    measured at {e['scale']}; you are at {far}"
                         f"{' -- MORE THAN 10x AWAY' if dist and dist['far'] else ''}")
            lines.append(f"    decided on {', '.join(e['decided_on'] or e['replicated_on'] or e['contradicted_on'])}"
                         f" ({e['basis']})")
            lines += _replications(e)
        for e in d.get("decided_elsewhere") or []:
            lines.append(f"  {e['status_text']}: {e['name']} -- {e['claim']}: {e['verdict']}, {_g(e['measured'])} "
                         f"[{_g(e['ci95'][0])}, {_g(e['ci95'][1])}], Holm p {_g(e['p_holm'])}, n {e['n']} "
                         f"({e['basis']})")
            lines += _replications(e)
        for part, label in (("undecided", UNDECIDED), ("not_observable", NOT_OBSERVABLE_STATUS)):
            for e in d[part]:
                lines.append(f"  {e['status'] if e['status'] == CONTESTED else label}: {e['name']} -- {e['claim']} "
                             f"({e['verdict']}, Holm p {_g(e['p_holm'])}, at {e['scale']})")
                lines += _replications(e)
        if not any(d.get(p) for p in ("decided", "decided_elsewhere", "undecided", "not_observable")):
            lines.append("  no stored evidence")
    lines.append("")
    lines.append("Cost at your shape (training FLOPs per token, variant / baseline):")
    for c in res["costs"]:
        lines.append(f"  {c['variant']} / {c['baseline']}: {c['ratio']:.4f}")
    for s in res["sweeps"]:
        lines.append(f"\nSweep {s['sweep']} (baseline {s['baseline']}; {s['metric']}):")
        for c in s["comparisons"]:
            if not c["n"]:
                lines.append(f"  {c['variant']}: {c['note']}")
                continue
            es, ef = c["equal_steps"], c["equal_flops"]
            lines.append(f"  {c['variant']} - {c['baseline']} (n {c['n']}): equal steps {es['diff']:+.4f} "
                         f"± {_g(es['half'])} ({es['reading']}); equal FLOPs ({ef['flops']:.3g}) {ef['diff']:+.4f} "
                         f"± {_g(ef['half'])} ({ef['reading']})"
                         + (" -- THE VERDICT CHANGES at equal FLOPs" if c["changed"] else ""))
        lines += _probe_lines(s)
    n = res["next"]
    lines.append("")
    if n is None:
        lines.append("No open question with a sweep recipe.")
    else:
        est = n["estimate"]
        lines.append(f"Next question: {n['claim']} ({n['why']}; rule: {n['rule']}).")
        if "command" in n:
            lines.append(f"  {n['command']}")
        lines.append(f"  {est['runs']} runs x {est['tokens_per_run']:.3g} tokens = {est['flops']:.3g} training "
                     f"FLOPs; here: {_duration(est['seconds_here'])} at {est['rate_flops_per_s']:.3g} FLOP/s "
                     f"({est['rate_source']}); GPU: {est['gpu']}")
    return "\n".join(lines)


def _scaling_lines(sc: dict[str, Any] | None) -> list[str]:
    if sc is None:
        return ["Scaling fits: none packaged; `normlab compare --preset scaling` then `normlab scaling SWEEP_DIR` "
                "fits a size sweep (docs/scaling.md)."]
    fits = "; ".join(f"{k}: A {f['params']['A']:.3g}, alpha {f['params']['alpha']:.3g}"
                     + (" (degenerate)" if f["degenerate"] else "") for k, f in sc["fits"].items())
    far = " -- MORE THAN 10x AWAY" if sc["far"] else ""
    verdict = ("they reach your model for " + ", ".join(k for k, v in sc["reaches"].items() if v)
               if sc["reaches_any"] else "they do not reach your model: " + "; ".join(sc["why_not"]))
    return [f"Scaling fits ({sc['points']}, `{sc['command']}`, {sc['date']}, corpus {sc['corpus']}; "
            f"L(N) = E + A N^-alpha in {sc['metric']} over N {sc['n_min']:,}-{sc['n_max']:,} at "
            f"{sc['tokens_per_param_fitted']:g} tokens per parameter): {fits}.",
            f"  Your model is {_factor(sc['params_over_largest'])} the largest fitted size{far}, at "
            f"{sc['tokens_per_param']:.3g} tokens per parameter; {verdict}."]


def _probe_lines(s: dict[str, Any]) -> list[str]:
    out = []
    for name, n, first, _, gain, chance, acc, chance_acc in probes.cells(s["probes"]):
        out.append(f"  probes {name} (n {n}): induction gain {gain} nats (first copy {first}, chance {chance}); "
                   f"recall accuracy {acc} (chance {chance_acc})")
    out += [f"  probes not measured: {m}" for m in s["probes_missing"]]
    return out


def _replications(e: dict[str, Any]) -> list[str]:
    return [f"    replication on {r['corpus']}{' at ' + r['scale'] if r.get('scale') else ''} "
            f"(seeds {r['seeds'][0]}-{r['seeds'][-1]}, `{r['command']}`): "
            f"{r['contrast']} {r['estimate']:+.3g} ± {r['half_width']:.3g}, Holm p {_g(r['p_adj'])}: {r['reading']}"
            f"{' (the claim side)' if r['claim_side'] else ''}" for r in e["replications"]]


def _duration(s: float) -> str:
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.3g} {unit}"
    return f"{s:.3g} s"
