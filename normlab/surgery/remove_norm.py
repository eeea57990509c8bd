"""``normlab remove-norm RUN_DIR --out DIR``: remove LayerNorm by fine-tuning (fixed-scale schedule).

Heimersheim 2024, "You can remove GPT2's LayerNorm by fine-tuning" (arXiv:2409.13710); Baroni et al. 2025,
"Transformers Don't Need LayerNorm at Inference Time" (arXiv:2507.02559; repo submarat/removing-layer-norm, whose
``config.py`` removes the MLP-input norms ``ln2`` layer by layer, then the attention-input norms ``ln1`` (split
into q/k and v inputs), then the final ``ln_f``, a few optimizer steps apart; GPT-2 small: 300 steps at lr 6e-4).

Schedule (``schedule='group'``, the default, or ``'site'``: one norm at a time in the same order)::

    stage 1: every MLP-input norm     stage 2: every attention-input norm     stage 3: the final norm

At each stage, for each of its sites, the average per-token divisor of the live norm is measured on training
windows of the current model (``sqrt(var(x) + eps)`` for LayerNorm, ``sqrt(mean(x^2) + eps)`` for RMSNorm, x the
site's input, averaged over tokens), stored as the site's fixed ``scale`` (normlab/norms/fixedscale.py), and then
the model is fine-tuned ``steps`` optimizer steps with ``normlab train --init-from`` on the run's own training
data (or ``data``). Every stage is a run directory under ``DIR/stages/``; ``DIR`` itself is the final run (norm
``fixedscale``, every site fixed: no norm computes a statistic; the mean subtraction of a LayerNorm site is the
fixed projection ``I - 11^T/d``). ``removal.json`` has, per stage, the loss (nats/token) and bits/byte on the
first ``max_tokens`` validation tokens right after the removal and after the fine-tune, and their change vs the
original. ``control=True`` also fine-tunes the original model for the same total steps, so the removal's cost is
separated from what fine-tuning alone gains (Baroni et al. compare with such a baseline).

Deviations from the authors' recipe, at this scale: one attention-input norm per block (not split q/k vs v), no
special treatment of the first / end-of-text positions (byte-level corpora have no BOS token), no auxiliary loss.
Supported: Pre-LN ``layernorm`` or ``rmsnorm`` runs (``pre``, or ``mix`` with no Post-LN block), any attention
kind; refused with one line otherwise.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from normlab.config import derive_config
from normlab.errors import NormlabError
from normlab.eval.lm import evaluate
from normlab.io import check_new_dir, publish_dir, read_json, write_json
from normlab.model import build_model
from normlab.model.placements import IN_SITES, block_sites
from normlab.norms.fixedscale import FixedScaleNorm
from normlab.rundir.files import INIT_FROM_FILE, SUMMARY_FILE
from normlab.rundir.publish import write_run
from normlab.rundir.readers import load_run, run_data
from normlab.train.loop import train

FORMAT = "normlab-norm-removal-v1"
NORMS = ("layernorm", "rmsnorm")
SCHEDULES = ("group", "site")
GROUP_ORDER = ("mlp", "attn", "final")
EQUIV_TOL = 1e-5


def _stop_if_interrupted(summary: dict) -> None:
    """A fine-tune stopped by Ctrl-C or SIGTERM (status ``interrupted``) stops remove-norm as an interruption
    (``KeyboardInterrupt``: exit 130, nothing published), not as a failed fine-tune."""
    if summary.get("status") == "interrupted":
        raise KeyboardInterrupt


def check_removable(cfg, model: nn.Module) -> None:
    """One-line refusal unless ``cfg`` is a Pre-LN layernorm / rmsnorm model."""
    mc = cfg.model
    if mc.norm not in NORMS:
        raise NormlabError(f"remove-norm works on Pre-LN layernorm or rmsnorm runs; this run uses norm "
                           f"'{mc.norm}' (nothing per-token to replace by a fixed scale)")
    for l in range(mc.depth):
        sites = block_sites(mc, l)
        if sites != set(IN_SITES):
            other = ", ".join(sorted(sites - set(IN_SITES))) or "no input norm"
            raise NormlabError(f"remove-norm needs Pre-LN blocks x + F(Norm(x)); placement '{mc.placement}' has "
                               f"{other} in block {l} (a norm on the residual stream or branch output, outside the "
                               "fixed-scale schedule of Heimersheim 2024)")
    if not isinstance(getattr(model, "embed_norm", nn.Identity()), nn.Identity):
        raise NormlabError("remove-norm needs Pre-LN blocks; this run has an embedding norm on the residual stream")


def site_names(model: nn.Module) -> dict[str, list[str]]:
    """``{group: [module names]}`` in schedule order: mlp inputs, attention inputs, the final norm (if any)."""
    out = {"mlp": [f"blocks.{l}.mlp_in" for l in range(len(model.blocks))],
           "attn": [f"blocks.{l}.attn_in" for l in range(len(model.blocks))], "final": []}
    if not isinstance(model.final_norm, nn.Identity):
        out["final"] = ["final_norm"]
    return out


def stages(model: nn.Module, schedule: str) -> list[tuple[str, list[str]]]:
    """``[(label, module names)]``: one stage per group, or per site."""
    if schedule not in SCHEDULES:
        raise NormlabError(f"--schedule {schedule} is not supported; allowed: {', '.join(SCHEDULES)}")
    groups = site_names(model)
    if schedule == "group":
        return [(g, groups[g]) for g in GROUP_ORDER if groups[g]]
    return [(n.replace("blocks.", "b").replace(".", "-"), [n]) for g in GROUP_ORDER for n in groups[g]]


def to_fixedscale(model: nn.Module, cfg):
    """``(config, model)``: the same function with every norm a live ``fixedscale`` norm (exact copy)."""
    mc = cfg.model
    opts: dict[str, Any] = {"center": mc.norm == "layernorm"}
    mods = {"attn": model.blocks[0].attn_in, "mlp": model.blocks[0].mlp_in, "final": model.final_norm}
    for g, m in mods.items():
        if isinstance(m, nn.Identity):
            continue
        opts[f"affine@{g}"] = m.weight is not None
        opts[f"bias@{g}"] = m.bias is not None
    new_cfg = derive_config(cfg, {"model.norm": "fixedscale", "model.norm_options": opts})
    torch.manual_seed(cfg.seed)
    new = build_model(new_cfg.model).eval()
    src = model.state_dict()
    state = new.state_dict()
    unit_offset = {n for n, m in model.named_modules() if getattr(m, "unit_offset", False)}
    with torch.no_grad():
        for k, v in state.items():
            if k.endswith(".scale") and k not in src:
                continue  # the fixed-scale buffer: 0 = live
            w = src[k]
            if k.endswith(".weight") and k[: -len(".weight")] in unit_offset:
                w = 1.0 + w
            v.copy_(w)
    return new_cfg, new


def measure_scales(model: nn.Module, names: list[str], x: torch.Tensor) -> dict[str, float]:
    """Average per-token divisor of each live norm in ``names`` on the token batch ``x [B, T]``."""
    mods = dict(model.named_modules())
    acc: dict[str, float] = {}
    hooks = [mods[n].register_forward_pre_hook(
        lambda m, args, n=n: acc.__setitem__(n, float(m.statistic(args[0]).mean()))) for n in names]
    try:
        with torch.no_grad():
            model.eval()
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return acc


def affine_defect(module: nn.Module, dim: int, seed: int = 0) -> float:
    """How far ``module`` is from an affine map of its input: max over random ``x, y`` of
    ``|f(x + y) - f(x) - f(y) + f(0)|`` and ``|f(2x) - 2 f(x) + f(0)|`` (0 for an affine map; order 1 for a
    norm that divides by a per-token statistic)."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, dim, generator=g, dtype=torch.float64), torch.randn(8, dim, generator=g, dtype=torch.float64)
    m = copy.deepcopy(module).double().eval()
    with torch.no_grad():
        z = m(torch.zeros_like(x))
        a = (m(x + y) - m(x) - m(y) + z).abs().max().item()
        b = (m(2 * x) - 2 * m(x) + z).abs().max().item()
    return max(a, b)


def norm_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every norm site of a GPT that holds a module other than Identity."""
    names = ("attn_in", "mlp_in", "attn_out", "mlp_out", "attn_post", "mlp_post", "final_norm", "embed_norm")
    return {n: m for n, m in model.named_modules() if n.split(".")[-1] in names and not isinstance(m, nn.Identity)}


def statistic_free(model: nn.Module) -> dict[str, Any]:
    """The check of the output: every norm is a fixed FixedScaleNorm and numerically affine."""
    mods = norm_modules(model)
    live = [n for n, m in mods.items() if not (isinstance(m, FixedScaleNorm) and m.fixed)]
    defect = max((affine_defect(m, m.dim) for m in mods.values()), default=0.0)
    return {"norm_sites": len(mods), "live_sites": live, "max_affine_defect": defect}


def _windows(tokens: np.ndarray, context: int, n: int) -> torch.Tensor:
    starts = np.linspace(0, len(tokens) - context - 1, n).astype(np.int64)
    return torch.from_numpy(np.stack([tokens[s:s + context].astype(np.int64) for s in starts]))


def _write_run(path: Path, cfg, model: nn.Module, summary: dict[str, Any], name: Path | None = None,
               source: Path | None = None, records: dict[str, dict[str, Any]] | None = None) -> None:
    """One stage's (or the final) run directory, derived from ``source`` (normlab.rundir.publish.write_run)."""
    write_run(path, cfg, model, {"status": "completed", **summary, "config_hash": cfg.hash(),
                                 "params": sum(p.numel() for p in model.parameters()), "run_dir": str(name or path)},
              derived_from=source, records=records)


def _published_paths(stage: Path, tmp: Path, out: Path) -> None:
    """A stage trained inside the publish temp dir ``tmp`` recorded its paths there (``run_dir``, ``init_from``,
    ``weights``); name the published ones under ``out`` instead (init_from.json first, summary.json last)."""
    for name in (INIT_FROM_FILE, SUMMARY_FILE):
        path = stage / name
        if not path.is_file():
            continue
        record = read_json(path, name)
        fixed = {k: str(out / Path(v).relative_to(tmp)) if isinstance(v, str) and Path(v).is_relative_to(tmp) else v
                 for k, v in record.items()}
        if fixed != record:
            write_json(path, fixed)


def _finetune_config(cfg, *, steps: int, lr: float, data_source: str | None):
    t = cfg.train
    changes = {"train.steps": steps, "train.lr": lr, "train.warmup_steps": min(t.warmup_steps, max(steps // 10, 0)),
               "train.eval_every": steps, "train.checkpoint_every": steps, "train.log_every": max(1, steps // 4)}
    if data_source:
        changes["data.source"] = data_source
    return derive_config(cfg, changes)


def remove_norm_run(run_dir: str | Path, out: str | Path, *, steps: int = 100, lr: float | None = None,
                    schedule: str = "group", data_source: str | None = None, max_tokens: int = 16384,
                    batch_size: int = 16, control: bool = False, measure_windows: int = 16,
                    quiet: bool = True) -> dict[str, Any]:
    """Run the schedule on ``run_dir``; write the norm-free run to ``out`` (whole or absent); return the record."""
    if steps < 0 or max_tokens < 1 or batch_size < 1:
        raise NormlabError("--steps must be >= 0, --max-tokens and --batch-size >= 1")
    if lr is not None and not lr > 0:
        raise NormlabError(f"--lr must be > 0, got {lr}")
    if schedule not in SCHEDULES:
        raise NormlabError(f"--schedule {schedule} is not supported; allowed: {', '.join(SCHEDULES)}")
    run_dir, out = Path(run_dir), Path(out)
    check_new_dir(out)
    src = load_run(run_dir, final_only=True)
    check_removable(src.cfg, src.model)
    data = run_data(run_dir, src.cfg)  # the run's own tokenizer; a changed corpus is refused
    ctx = src.cfg.model.context
    lr = lr if lr is not None else src.cfg.train.lr / 10
    if data_source:
        run_data(run_dir, src.cfg, source=data_source)  # a bad --data fails here, before any work

    def score(m: nn.Module) -> dict[str, float]:
        r = evaluate(m, data.val, data.token_bytes, data.tokenizer.decode_bytes, context=ctx, batch_size=batch_size,
                     max_tokens=max_tokens)
        return {"loss": r["loss"], "bpb": r["bpb"]}

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    base = score(src.model)
    cfg, model = to_fixedscale(src.model, src.cfg)
    with torch.no_grad():
        probe_x = _windows(data.val, ctx, 2)
        equiv = float((model(probe_x) - src.model(probe_x)).abs().max())
    if not equiv <= EQUIV_TOL:
        raise NormlabError(f"internal: the fixedscale copy differs from the source by {equiv:.3g}")
    plan = stages(model, schedule)
    measure_x = _windows(data.train, ctx, measure_windows)
    records = []
    with publish_dir(out) as tmp:
        for k, (label, names) in enumerate(plan, 1):
            scales = measure_scales(model, names, measure_x)
            mods = dict(model.named_modules())
            with torch.no_grad():
                for n, s in scales.items():
                    mods[n].scale.fill_(s)
            removed_dir = tmp / "stages" / f"{k:02d}-{label}-removed"
            after_removal = score(model)
            _write_run(removed_dir, cfg, model, {"val_loss": after_removal["loss"], "val_bpb": after_removal["bpb"]},
                       name=out / removed_dir.relative_to(tmp), source=run_dir)
            rec = {"stage": k, "label": label, "sites": names, "scales": scales, "after_removal": after_removal,
                   "removal_delta_nats": after_removal["loss"] - base["loss"],
                   "removal_delta_bpb": after_removal["bpb"] - base["bpb"]}
            if steps > 0:
                tuned_dir = tmp / "stages" / f"{k:02d}-{label}-tuned"
                ft = _finetune_config(cfg, steps=steps, lr=lr, data_source=data_source)
                s = train(ft, tuned_dir, init_from=removed_dir, quiet=True)
                _published_paths(tuned_dir, tmp, out)
                _stop_if_interrupted(s)  # Ctrl-C / SIGTERM: exit 130 with the interrupt line, not a divergence hint
                if s["status"] != "completed":
                    raise NormlabError(f"remove-norm: the fine-tune of stage {k} ({label}) {s['status']} at step "
                                       f"{s['step']}; try a smaller --lr")
                model = load_run(tuned_dir, final_only=True).model
                after = score(model)
                rec.update({"after_finetune": after, "run": f"stages/{tuned_dir.name}"})
            else:
                after = after_removal
                rec["run"] = f"stages/{removed_dir.name}"
            rec.update({"delta_nats": after["loss"] - base["loss"], "delta_bpb": after["bpb"] - base["bpb"]})
            records.append(rec)
            say(f"stage {k}/{len(plan)} {label}: removed {len(names)} site(s); loss {base['loss']:.4f} -> "
                f"{after_removal['loss']:.4f} (removal) -> {after['loss']:.4f} nats/token")
        final = score(model)
        check = statistic_free(model)
        if check["live_sites"]:
            raise NormlabError(f"internal: norms still computing a statistic: {check['live_sites'][:3]}")
        ctrl = None
        if control and steps > 0:
            ctl_dir = tmp / "stages" / "control-ln-finetuned"
            ft = _finetune_config(src.cfg, steps=steps * len(plan), lr=lr, data_source=data_source)
            s = train(ft, ctl_dir, init_from=run_dir, quiet=True)
            _published_paths(ctl_dir, tmp, out)
            _stop_if_interrupted(s)
            if s["status"] == "completed":
                c = score(load_run(ctl_dir, final_only=True).model)
                ctrl = {**c, "steps": steps * len(plan), "run": "stages/control-ln-finetuned",
                        "delta_nats_vs_control": final["loss"] - c["loss"],
                        "delta_bpb_vs_control": final["bpb"] - c["bpb"]}
            else:
                ctrl = {"status": s["status"], "run": "stages/control-ln-finetuned"}
        record = {
            "format": FORMAT, "paper": "Heimersheim 2024 (arXiv:2409.13710); Baroni et al. 2025 (arXiv:2507.02559)",
            "source": str(run_dir), "norm_from": src.cfg.model.norm, "schedule": schedule, "steps_per_stage": steps,
            "lr": lr, "data": data_source or src.cfg.data.source, "eval_split": "val", "eval_max_tokens": max_tokens,
            "original": base, "final": final, "delta_nats": final["loss"] - base["loss"],
            "delta_bpb": final["bpb"] - base["bpb"], "stages": records, "control": ctrl, "check": check,
        }
        _write_run(tmp, cfg, model, {"removed_from": str(run_dir), "val_loss": final["loss"], "val_bpb": final["bpb"],
                                     "delta_nats": record["delta_nats"], "delta_bpb": record["delta_bpb"],
                                     "entropy_floor_bpb": data.entropy_floor_bpb}, name=out, source=run_dir,
                   records={"removal.json": record})
    return {**record, "out": str(out)}
