"""Gradient clipping (``train.clip``): global norm clipping or AdaGC.

- ``global`` (default): ``torch.nn.utils.clip_grad_norm_`` over all parameters at ``train.grad_clip``
  (0 = no clipping).
- ``adagc``: AdaGC (Wang et al. 2025, "AdaGC: Improving Training Stability for Large Language Model Pretraining",
  arXiv:2502.11034; ICML version "AdaGC: Enhancing LLM Pretraining Stability via Adaptive Gradient Clipping").
  Each parameter tensor ``i`` keeps ``gamma_i``, an exponential moving average of its own *clipped* gradient
  norm, and is clipped relative to it::

      warm-up (t < T_start):  h   = min(1, lambda_abs / ||g_t||)           (global clipping, ||g_t|| over all)
                              g^_i = h g_i,   gamma_i = min(gamma_i, ||g^_i||)    (gamma_i starts at +inf)
      after:                  h_i = min(1, lambda_rel gamma_i / ||g_i||)   (gamma_i of the previous step)
                              g^_i = h_i g_i,  gamma_i = beta gamma_i + (1 - beta) ||g^_i||

  ``lambda_abs`` = ``train.grad_clip`` (0: no clipping during the warm-up), ``lambda_rel`` =
  ``train.adagc_lambda`` (1.05), ``beta`` = ``train.adagc_beta`` (0.98), ``T_start`` = ``train.adagc_warmup``
  (default: the learning-rate warm-up, ``train.warmup_steps``; scaled down with the run, as our runs have
  hundreds of steps where the paper's have tens of thousands).

Both return the global gradient norm *before* clipping (what the loop logs as ``grad_norm`` and checks for
divergence). AdaGC's state (``gamma`` and the per-group clip counts) is saved in every checkpoint, so a resumed run
clips exactly as an uninterrupted one. Per parameter group (``attn``, ``mlp``, ``norm``, ``embed``, ``head``,
``other``: :func:`param_group`) it logs, on logging steps, ``adagc/clipped/<group>`` (the share of the group's
tensors clipped at that step) and ``adagc/threshold/<group>`` (the mean ``lambda_rel * gamma`` over them), and
``summary.json`` gets ``adagc_clipped: {group: clipped tensor-steps over the run}``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

CLIPS = ("global", "adagc")
CLIP_EPS = 1e-6  # as torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6)


def param_group(name: str) -> str:
    """The logging group of a GPT parameter: ``attn`` / ``mlp`` (a block's sublayer), ``norm`` (a norm site or the
    embedding / final norm), ``embed`` (token and position embeddings), ``head`` (an untied LM head), ``other``."""
    parts = name.split(".")
    if parts[0] == "blocks" and len(parts) > 2:
        return parts[2] if parts[2] in ("attn", "mlp") else "norm"
    if parts[0] in ("tok_emb", "pos_emb"):
        return "embed"
    if parts[0] in ("final_norm", "embed_norm"):
        return "norm"
    if parts[0] == "lm_head":
        return "head"
    return "other"


class GlobalClip:
    """``clip_grad_norm_`` over ``params`` at ``max_norm`` (0 = none)."""

    def __init__(self, params: list[nn.Parameter], max_norm: float):
        self.params, self.max_norm = params, max_norm

    def clip_on_device(self, step: int) -> torch.Tensor:
        """Clip; returns the global norm before clipping as a 0-dim tensor on the gradients' device (no host read:
        ``clip_grad_norm_`` scales by ``min(1, max_norm / (norm + 1e-6))`` on the device)."""
        return torch.nn.utils.clip_grad_norm_(self.params, self.max_norm if self.max_norm > 0 else math.inf)

    def clip(self, step: int) -> float:
        return float(self.clip_on_device(step))

    def mark(self) -> None:
        return None

    def restore(self, mark: None) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def summary(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        pass


class AdaGC:
    """AdaGC over named parameters (see the module docstring). ``clip(step)`` with ``step`` the 0-based index of
    the step being run clips the gradients in place and returns the global norm before clipping.

    Its state lives on the parameters' device and a step reads nothing to the host (:meth:`clip_on_device`): the
    thresholds ``gamma``, the scales and the per-tensor clip counts are tensors there; the per-group metrics and
    counts are read when asked for (a logged step, a checkpoint, the summary). The arithmetic is the host version's,
    operation for operation, so the CPU results are bit for bit those of reading every step."""

    def __init__(self, named: dict[str, nn.Parameter], *, lambda_abs: float, lambda_rel: float, beta: float,
                 warmup: int):
        self.names = list(named)
        self.params = [named[n] for n in self.names]
        self.groups = [param_group(n) for n in self.names]
        self.lambda_abs, self.lambda_rel, self.beta, self.warmup = lambda_abs, lambda_rel, beta, warmup
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.gamma = torch.full((len(self.params),), math.inf, dtype=torch.float64, device=self.device)
        self.base_counts: dict[str, int] = {g: 0 for g in dict.fromkeys(self.groups)}  # as of the last load
        self.clipped = torch.zeros(len(self.params), dtype=torch.int64, device=self.device)  # clipped steps since
        self._last: tuple[list[int], torch.Tensor, torch.Tensor] | None = None  # have, scale, new gamma
        self._index_cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def _index(self, have: list[int]) -> torch.Tensor | None:
        """``have`` as an index tensor on the device (None: every parameter); copied from pinned memory without
        blocking the host, once per distinct set."""
        if len(have) == len(self.params):
            return None
        key = tuple(have)
        if key not in self._index_cache:
            host = torch.tensor(have)
            if self.device.type == "cpu":
                self._index_cache[key] = (host, host)
            else:  # the pinned source stays alive with its copy
                host = host.pin_memory()
                self._index_cache[key] = (host, host.to(self.device, non_blocking=True))
        return self._index_cache[key][1]

    @torch.no_grad()
    def clip_on_device(self, step: int) -> torch.Tensor | float:
        """Clip; returns the global norm before clipping as a 0-dim float64 tensor on the gradients' device, with
        no host read."""
        have = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not have:
            return 0.0
        grads = [self.params[i].grad for i in have]
        norms = torch.stack([torch.linalg.vector_norm(g.detach().double()) for g in grads])
        total = torch.linalg.vector_norm(norms)
        idx = self._index(have)
        gamma = self.gamma if idx is None else self.gamma[idx]
        if step < self.warmup:
            if self.lambda_abs > 0:
                x = torch.full_like(total, self.lambda_abs) / (total + CLIP_EPS)
                h = torch.where(x < 1.0, x, 1.0)  # Python's min(1.0, x): a NaN norm leaves h = 1
            else:
                h = torch.ones_like(total)
            scale = h.expand_as(norms)
            new_gamma = torch.minimum(gamma, norms * scale)
        else:
            scale = (self.lambda_rel * gamma / (norms + CLIP_EPS)).clamp(max=1.0)
            scale = torch.where(torch.isfinite(gamma), scale, torch.ones_like(scale))  # never seen: not clipped
            clipped = norms * scale
            new_gamma = torch.where(torch.isfinite(gamma), self.beta * gamma + (1 - self.beta) * clipped, clipped)
        if idx is None:
            self.gamma = new_gamma
        else:
            self.gamma[idx] = new_gamma
        hit = scale < 1.0
        factor = torch.where(hit, scale, 1.0)  # a gradient is scaled where its scale is below 1 (x 1.0 is exact)
        for j, g in enumerate(grads):
            g.mul_(factor[j])
        if idx is None:
            self.clipped += hit
        else:
            self.clipped.index_add_(0, idx, hit.long())
        self._last = (have, scale, new_gamma)
        return total

    def clip(self, step: int) -> float:
        return float(self.clip_on_device(step))

    def mark(self) -> torch.Tensor:
        """The clip counts as they are now (a device copy), for :meth:`restore` when the steps after it are dropped
        (a run that diverged before them; normlab.train.runstate.RunState.settle)."""
        return self.clipped.clone()

    def restore(self, mark: torch.Tensor | None) -> None:
        if mark is not None:
            self.clipped = mark

    def metrics(self) -> dict[str, float]:
        """The last step's per-group clip share and mean threshold (flat keys for metrics.jsonl); read here."""
        if self._last is None:
            return {}
        have, scale, new_gamma = self._last
        shares, thresholds = scale.tolist(), (self.lambda_rel * new_gamma).tolist()
        per: dict[str, list[tuple[bool, float]]] = {}
        for j, i in enumerate(have):
            per.setdefault(self.groups[i], []).append((shares[j] < 1.0, thresholds[j]))
        last: dict[str, float] = {}
        for grp, rows in per.items():
            last[f"adagc/clipped/{grp}"] = sum(c for c, _ in rows) / len(rows)
            finite = [t for _, t in rows if math.isfinite(t)]
            if finite:
                last[f"adagc/threshold/{grp}"] = sum(finite) / len(finite)
        return last

    @property
    def counts(self) -> dict[str, int]:
        """Clipped tensor-steps per group over the run (read here)."""
        counts = dict(self.base_counts)
        for grp, n in zip(self.groups, self.clipped.tolist()):
            counts[grp] = counts.get(grp, 0) + n
        return counts

    def summary(self) -> dict[str, Any]:
        return {"adagc_clipped": self.counts}

    def state_dict(self) -> dict[str, Any]:
        return {"gamma": [None if not math.isfinite(v) else v for v in self.gamma.tolist()], "names": self.names,
                "counts": self.counts}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        if state.get("names") != self.names:
            raise ValueError("the AdaGC state in the checkpoint is for other parameters")
        self.gamma = torch.tensor([math.inf if v is None else float(v) for v in state["gamma"]],
                                  dtype=torch.float64).to(self.device)
        self.base_counts = {k: int(v) for k, v in state["counts"].items()}
        self.clipped = torch.zeros_like(self.clipped)


def build_clipper(model: nn.Module, tcfg: Any) -> GlobalClip | AdaGC:
    """The clipper ``train.clip`` names, over ``model``'s trainable parameters (tied weights once)."""
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if tcfg.clip == "adagc":
        warmup = tcfg.adagc_warmup if tcfg.adagc_warmup is not None else tcfg.warmup_steps
        return AdaGC(named, lambda_abs=tcfg.grad_clip, lambda_rel=tcfg.adagc_lambda, beta=tcfg.adagc_beta,
                     warmup=warmup)
    return GlobalClip(list(named.values()), tcfg.grad_clip)
