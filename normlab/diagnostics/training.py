"""Training-time diagnostics: cheap per-block statistics every ``diag.every`` steps, and loss-spike detection.

What is recorded (flat numeric keys in ``metrics.jsonl``, one record per diagnostic step; docs/diagnostics.md):

- ``diag/embed_rms``, ``diag/embed_var``: the residual stream entering block 0 (embeddings after the optional
  embedding norm and dropout);
- ``diag/resid_rms/<l>``, ``diag/resid_var/<l>``: block ``l``'s output (0-based), pooled over every element of
  the batch ``[B, T, d]``: ``rms = sqrt(mean(x^2))``, ``var = mean(x^2) - mean(x)^2`` (Curse of Depth, Sun et al.
  2025; Peri-LN, Kim et al. 2025);
- ``diag/norm_rms/<module path>``: output RMS of every norm module (e.g. ``blocks.0.attn_in``, ``final_norm``;
  ``nn.Identity`` sites have none). For LayerNorm Scaling this is before the ``1/sqrt(l)`` factor;
- ``diag/grad_norm/{attn,mlp,norm}/<l>``: L2 norm of the gradient of block ``l``'s attention, MLP and norm-site
  parameters (before gradient clipping; Mix-LN, Li et al. 2024), and ``diag/grad_norm/final_norm``,
  ``diag/grad_norm/embed_norm`` for the model-level norms;
- ``diag/attn_logit_max/<l>``, ``diag/output_lse``: the instability signals of Wortsman et al. 2023 (largest
  pre-softmax attention logit per block, mean logsumexp of the output logits; normlab.diagnostics.instability);
- ``diag/softmax_collapse``, ``diag/logits_beyond_exp``: Softmax Collapse (Prieto et al. 2025): the fraction of
  positions whose float32 softmax is exactly one-hot (sum of exponentials exactly 1, as the authors' logger counts
  it), and of logits beyond the float32 ``exp`` range (normlab.diagnostics.collapse; the loop passes the logits and
  targets to :meth:`TrainDiagnostics.observe_output`);
- ``diag/hc_gain_fwd``, ``diag/hc_gain_bwd``: the gain of the composite residual mapping of a model with residual
  streams (hyper-connections, mHC; normlab.diagnostics.streams);
- ``diag/tev_mean``, ``diag/tev_std``: Token Embedding Variability (Chung et al. 2024), and
  ``diag/head_rms_inf_norm``, ``diag/head_spectral_norm``: the output layer's operator norms (Filatov et al. 2025;
  normlab.diagnostics.weightnorms), of the weights as they are after the step's backward, before the update;
- ``diag/loss_spike`` (= 1) and ``diag/loss_baseline`` on a step whose loss is a spike (any step, diag step or
  not): ``loss > spike_factor * mean(previous spike_window losses)``, needing a full window. Non-finite losses
  count as spikes.

With gradient accumulation the activation statistics pool all micro-batches of the step. A diagnostic step is
one with ``(step + 1) % every == 0`` (``step`` the 0-based index of the step being run, as the loop's effective-LR
tracking); its record carries ``step + 1`` like every metrics record. Forward hooks exist only during a
diagnostic step's forward/backward and are removed in :meth:`TrainDiagnostics.after_backward`, so other steps pay
one integer modulo.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Iterable

import torch
from torch import nn

from normlab.config import DiagConfig
from normlab.diagnostics.collapse import softmax_collapse
from normlab.diagnostics.instability import InstabilityProbe
from normlab.diagnostics.streams import StreamGainProbe
from normlab.diagnostics.weightnorms import weight_norm_tensors
from normlab.model.placements import SITES

MAX_LISTED_SPIKES = 1000


def detect_spikes(losses: Iterable[float], factor: float, window: int) -> list[int]:
    """Indices ``i`` of ``losses`` with ``losses[i] > factor * mean(losses[i-window:i])`` (full window only) or a
    non-finite ``losses[i]`` after a full window. Reference implementation of :class:`SpikeDetector`."""
    losses = list(losses)
    out = []
    for i in range(window, len(losses)):
        base = sum(losses[i - window : i]) / window
        if not math.isfinite(losses[i]) or losses[i] > factor * base:
            out.append(i)
    return out


class SpikeDetector:
    """Online loss-spike detector: the previous ``window`` losses form the baseline (spikes included)."""

    def __init__(self, factor: float, window: int):
        self.factor, self.window = factor, window
        self.history: deque[float] = deque(maxlen=window)
        self.steps: list[int] = []
        self.count = 0

    def update(self, step: int, loss: float) -> float | None:
        """Feed the loss of ``step``; returns the baseline when it is a spike, else None."""
        spike = None
        if len(self.history) == self.window:
            base = sum(self.history) / self.window
            if not math.isfinite(loss) or loss > self.factor * base:
                spike = base
                self.count += 1
                if len(self.steps) < MAX_LISTED_SPIKES:
                    self.steps.append(step)
        self.history.append(loss)
        return spike

    def summary(self) -> dict[str, Any]:
        """``{count, steps}`` for summary.json (at most ``MAX_LISTED_SPIKES`` steps listed)."""
        return {"count": self.count, "steps": list(self.steps)}

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "steps": list(self.steps), "count": self.count}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        self.history = deque((float(v) for v in state["history"]), maxlen=self.window)
        self.steps = [int(s) for s in state["steps"]]
        self.count = int(state["count"])


class _Moments:
    """Running ``sum(x)``, ``sum(x^2)`` (0-dim float64 tensors on the activations' device, so a hook never waits
    for the device) and element count of the tensors seen by a hook; read once per diagnostic step."""

    __slots__ = ("s", "ss", "n")

    def __init__(self) -> None:
        self.s: torch.Tensor | float = 0.0
        self.ss: torch.Tensor | float = 0.0
        self.n = 0

    @torch.no_grad()
    def add(self, x: torch.Tensor) -> None:
        x = x.detach()
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        # float32 reductions (pairwise summation, ~15x faster than float64 on CPU), accumulated in float64
        self.s = self.s + x.sum().double()
        self.ss = self.ss + torch.linalg.vector_norm(x).double().square()
        self.n += x.numel()

    def rms(self, s: float, ss: float) -> float:
        """``sqrt(mean(x^2))`` from the sums read to the host (``s``, ``ss``: this object's, as floats)."""
        return math.sqrt(ss / self.n)

    def var(self, s: float, ss: float) -> float:
        """``max(mean(x^2) - mean(x)^2, 0)`` from the sums read to the host."""
        mean = s / self.n
        return max(ss / self.n - mean * mean, 0.0)


def _is_site(m: nn.Module) -> bool:
    return not isinstance(m, nn.Identity)


def norm_modules(model: nn.Module) -> dict[str, nn.Module]:
    """``{module path: norm module}`` for every occupied norm site of a GPT (embed, block sites, final)."""
    out: dict[str, nn.Module] = {}
    if _is_site(getattr(model, "embed_norm", nn.Identity())):
        out["embed_norm"] = model.embed_norm
    for l, blk in enumerate(model.blocks):
        for site in SITES:
            m = getattr(blk, site, None)
            if m is not None and _is_site(m):
                out[f"blocks.{l}.{site}"] = m
    if _is_site(getattr(model, "final_norm", nn.Identity())):
        out["final_norm"] = model.final_norm
    return out


def _grad_norm(params: Iterable[nn.Parameter]) -> torch.Tensor | None:
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if not grads:
        return None
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()).double() for g in grads]))


def grad_norms(model: nn.Module) -> dict[str, torch.Tensor]:
    """Per-block gradient norms ``diag/grad_norm/{attn,mlp,norm}/<l>`` and of the model-level norms (flat keys), as
    0-dim float64 device tensors. Parameters without a gradient are skipped; a group with none is omitted."""
    out: dict[str, torch.Tensor] = {}
    for l, blk in enumerate(model.blocks):
        groups = {"attn": blk.attn.parameters(), "mlp": blk.mlp.parameters(),
                  "norm": (p for s in SITES for p in getattr(blk, s).parameters())}
        for name, ps in groups.items():
            v = _grad_norm(ps)
            if v is not None:
                out[f"diag/grad_norm/{name}/{l}"] = v
    for name in ("embed_norm", "final_norm"):
        v = _grad_norm(getattr(model, name).parameters())
        if v is not None:
            out[f"diag/grad_norm/{name}"] = v
    return out


def read_once(values: dict[str, Any], finite_only: set[str]) -> dict[str, float]:
    """``values`` (0-dim tensors on one device) read to floats in one transfer (``torch.stack(...).tolist()``), in
    their order; the keys of ``finite_only`` left out where non-finite."""
    if not values:
        return {}
    read = torch.stack([torch.as_tensor(v).double().reshape(()) for v in values.values()]).tolist()
    return {k: v for k, v in zip(values, read) if k not in finite_only or math.isfinite(v)}


class TrainDiagnostics:
    """The training loop's diagnostics object. Per step the loop calls::

        diag.start_step(step)            # before the forward: registers hooks on diagnostic steps only
        ...forward / backward (all micro-batches)...
        diag.after_backward(step, loss)  # grads are complete, before clipping: grad norms, spike check, hooks off
        record |= diag.collect()         # {} or {"step": step + 1, "diag/...": ...}

    and ``diag.summary()`` for summary.json, ``state_dict`` / ``load_state_dict`` for checkpoints (the spike
    detector's window, so a resumed run detects the same spikes).
    """

    def __init__(self, model: nn.Module, cfg: DiagConfig):
        self.cfg = cfg.validate()
        self.model = model
        self.spikes = SpikeDetector(cfg.spike_factor, cfg.spike_window)
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._moments: dict[str, _Moments] = {}
        self._record: dict[str, Any] = {}
        self.probe = InstabilityProbe(model)
        self.streams = StreamGainProbe(model)
        self._collapse: list[Any] = [0, 0, 0, 0]  # collapsed positions, beyond-exp logits, positions, logits

    def is_diag_step(self, step: int) -> bool:
        return self.cfg.every > 0 and (step + 1) % self.cfg.every == 0

    def start_step(self, step: int) -> None:
        """Register the forward hooks when ``step`` is a diagnostic step (else do nothing)."""
        self._record = {}
        if not self.is_diag_step(step):
            return
        self.remove_hooks()
        self._moments = {}
        self._collapse = [0, 0, 0, 0]

        def stat(key: str):
            m = self._moments.setdefault(key, _Moments())

            def hook(_mod: nn.Module, _inp: Any, out: torch.Tensor) -> None:
                m.add(out)

            return hook

        def pre_stat(key: str):
            m = self._moments.setdefault(key, _Moments())

            def hook(_mod: nn.Module, inp: tuple) -> None:
                m.add(inp[0])

            return hook

        blocks = self.model.blocks
        if len(blocks):
            self._handles.append(blocks[0].register_forward_pre_hook(pre_stat("embed")))
        for l, blk in enumerate(blocks):
            self._handles.append(blk.register_forward_hook(stat(f"resid/{l}")))
        for name, m in norm_modules(self.model).items():
            self._handles.append(m.register_forward_hook(stat(f"norm/{name}")))
        self.probe.attach()
        self.streams.attach()

    def observe_output(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """Count Softmax Collapse in a micro-batch's ``logits [B, T, V]`` against ``targets [B, T]`` (diagnostic
        steps only: does nothing when no hooks are attached)."""
        if not self._handles:
            return
        with torch.no_grad():
            for i, v in enumerate(softmax_collapse(logits, targets)):
                self._collapse[i] = self._collapse[i] + v

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.probe.detach()
        self.streams.detach()

    def after_backward(self, step: int, loss: float) -> None:
        """Spike check on ``loss``; on a diagnostic step also the gradient norms and the activation statistics.
        Always removes the hooks."""
        had_hooks = bool(self._handles)
        self.remove_hooks()
        rec: dict[str, Any] = {}
        base = self.spikes.update(step + 1, loss)
        if base is not None:
            rec.update({"diag/loss_spike": 1, "diag/loss_baseline": base})
        if had_hooks:  # every statistic of the step reduced on the device, read in one transfer, finished here
            sums = {k: m for k, m in self._moments.items() if m.n}
            dev: dict[str, Any] = {}
            for key, m in sums.items():
                dev[f"#s/{key}"], dev[f"#ss/{key}"] = m.s, m.ss
            dev.update(grad_norms(self.model))
            probe, weights = self.probe.tensors(), weight_norm_tensors(self.model)
            gains = self.streams.tensors()
            dev.update(probe)
            dev.update(weights)
            dev.update(gains)
            if isinstance(self._collapse[2], torch.Tensor):  # observed (counts on the device)
                dev.update(zip(("#collapsed", "#beyond", "#positions", "#logits"), self._collapse))
            got = read_once(dev, set())
            for key, m in sums.items():  # the host formulas, on the floats read (as before: bit for bit)
                s_, ss = got[f"#s/{key}"], got[f"#ss/{key}"]
                if key == "embed":
                    rec.update({"diag/embed_rms": m.rms(s_, ss), "diag/embed_var": m.var(s_, ss)})
                elif key.startswith("resid/"):
                    l = key.split("/", 1)[1]
                    rec.update({f"diag/resid_rms/{l}": m.rms(s_, ss), f"diag/resid_var/{l}": m.var(s_, ss)})
                else:
                    rec[f"diag/norm_rms/{key.split('/', 1)[1]}"] = m.rms(s_, ss)
            rec.update({k: v for k, v in got.items() if k.startswith("diag/grad_norm/")})
            rec.update(self.probe.finish({k: got[k] for k in probe}))
            rec.update(self.streams.finish({k: got[k] for k in gains}))
            rec.update({k: got[k] for k in weights if math.isfinite(got[k])})
            if got.get("#positions"):
                rec.update({"diag/softmax_collapse": got["#collapsed"] / int(got["#positions"]),
                            "diag/logits_beyond_exp": got["#beyond"] / int(got["#logits"])})
            self._moments = {}
        if rec:
            rec = {"step": step + 1, **rec}
        self._record = rec

    def collect(self) -> dict[str, Any]:
        """The record of the step just finished (``{}`` when nothing was recorded)."""
        rec, self._record = self._record, {}
        return rec

    def summary(self) -> dict[str, Any]:
        return self.spikes.summary()

    def state_dict(self) -> dict[str, Any]:
        return {"spikes": self.spikes.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state:
            self.spikes.load_state_dict(state.get("spikes"))
