"""Which runs stack, and the vmapped forward of a stacked group (normlab.train.stacked trains the group).

:func:`stack_key` is what the runs of one group share (the whole identity less ``seed`` and ``train.lr``);
:func:`group_configs` groups a sweep's runs by it. Not stacked (:func:`stack_refusal` names the reason, and
``train.stack: auto`` trains such runs alone): dropout on CUDA (the fused dropout kernels draw with Philox offsets a
draw outside them does not reproduce), dropout with a compiled run alone, norms that update running statistics in
their forward pass (PowerNorm, Unified Normalization, BatchNorm), and any model whose forward and backward
``torch.func.vmap`` cannot run (a trial on two copies). :class:`StackedForward` is the one vmapped
``functional_call`` the trial and the group both run::

    params[name]  [K, *shape]     x  [K, B, T]     logits = vmap(functional_call(base, .))(params, x)  [K, B, T, V]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import warnings
from typing import Any

import torch

from normlab.attention.dropout import draw_noise, recorded, supplied
from normlab.config import RunConfig
from normlab.model import build_model
from normlab.train.precision import autocast, resolve_compile
from normlab.train.step import compile_failure, micro_backward
from normlab.train.threads import step_flops

VMAP_FALLBACK_WARNING = "There is a performance drop because we have not yet implemented the batching rule"
MEMBER_KEYS = ("seed", "train.lr")  # what the members of one stacked group may differ in


def stack_key(cfg: RunConfig) -> str:
    """What runs of one stacked group share: the whole identity less ``seed`` and ``train.lr`` (JSON text)."""
    d = cfg.identity_dict()
    d.pop("seed", None)
    d["train"].pop("lr", None)
    d["train"].pop("stack", None)
    return json.dumps(d, sort_keys=True)


def stack_refusal(cfg: RunConfig, device: str | None = None) -> str | None:
    """Why ``cfg`` cannot train in a stacked group (one line), or None. ``device``: where it trains (``cuda`` or
    ``cpu``; a sweep's planner passes the device of the machine the group will run on, which for a Ray cluster is
    not this one); default: ``cfg.device``, ``auto`` resolved on this machine."""
    if cfg.model.dropout > 0:
        if device is None:
            device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
        if device == "cuda":
            return (f"model.dropout={cfg.model.dropout} on CUDA: the fused dropout kernels draw masks that a stacked "
                    "step cannot reproduce per member")
        if resolve_compile(cfg.train.compile, device, cfg.train.steps * step_flops(cfg))[0]:
            return (f"model.dropout={cfg.model.dropout} with train.compile on: a compiled run alone draws its dropout "
                    "masks in inductor's kernels, which a stacked step cannot reproduce per member")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model(cfg.model)
    names = [n for n, b in model.named_buffers(remove_duplicate=True) if not _constant_buffer(model, n)]
    if names:
        return (f"model.norm={cfg.model.norm}: its running statistics ({names[0]}) change in the forward pass, "
                "which a stacked step cannot keep per member")
    return _trial(model, cfg)


@contextlib.contextmanager
def quiet_vmap() -> Any:
    """Without torch's note that an operation runs member by member under vmap (CPU SDPA's flash kernel has no
    batching rule; docs/compare.md says so): on stderr it was two lines before any error line."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=VMAP_FALLBACK_WARNING, category=UserWarning)
        yield


def _trial(model: torch.nn.Module, cfg: RunConfig) -> str | None:
    """A stacked forward and backward of two copies of ``model`` on ``[2, 1, min(context, 16)]`` tokens (CPU, no
    RNG consumed): None when it runs, else why (an operation ``torch.func.vmap`` cannot batch)."""
    t = min(cfg.model.context, 16)
    x = torch.zeros(2, 1, t, dtype=torch.long)
    models = [model, model]  # the stacked forward stacks each member's parameters: two copies of model's
    try:
        with torch.random.fork_rng(), quiet_vmap():
            forward = StackedForward(model, False)
            noise = forward.draw(x, [None, None], "fp32")
            micro_backward(lambda: forward(models, x, noise), [x[0], x[1]], trial_train(cfg), "cpu")
    except Exception as e:  # noqa: BLE001 - any failure means: train these runs alone
        first = (str(e).splitlines() or [type(e).__name__])[0][:160]
        return f"its forward pass cannot run under torch.func.vmap ({type(e).__name__}: {first})"
    return None


def trial_train(cfg: RunConfig) -> Any:
    """The training keys the trial's step reads: ``cfg.train`` in fp32, one micro-batch."""
    return dataclasses.replace(cfg.train, precision="fp32", grad_accum=1)


def _constant_buffer(model: torch.nn.Module, name: str) -> bool:
    """A non-persistent buffer (RoPE / ALiBi tables, masks) is a constant of the architecture; a persistent one
    (running statistics) is state a forward pass may change."""
    mod_name, _, buf = name.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    return buf in mod._non_persistent_buffers_set


def group_configs(cfgs: list[RunConfig]) -> list[list[int]]:
    """Indices of ``cfgs`` grouped by :func:`stack_key`, in first-seen order (a group of one trains alone)."""
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cfgs):
        groups.setdefault(stack_key(c), []).append(i)
    return list(groups.values())


class StackedForward:
    """``forward(params [K, ...] per name, x [K, B, T], noise) -> logits [K, B, T, V]``: one vmapped
    ``functional_call`` of ``base`` (a module of the group's architecture whose own parameters are never used), with
    each member's dropout noise (``noise``: one ``[K, *shape]`` tensor per dropout call, :meth:`draw`; empty without
    dropout). With ``compile_`` (and no dropout) the vmapped function is ``torch.compile``d; if its first forward or
    backward fails (a transform torch cannot compile; AOTAutograd compiles the backward only when it first runs),
    :meth:`fall_back` switches the group to the eager function and ``note`` says why."""

    def __init__(self, base: torch.nn.Module, compile_: bool):
        def one(params: dict[str, torch.Tensor], x: torch.Tensor, noise: list[torch.Tensor]) -> torch.Tensor:
            if not noise:  # no dropout: the function torch.compile traces, unchanged
                return torch.func.functional_call(base, params, (x,))
            with supplied(noise):
                return torch.func.functional_call(base, params, (x,))

        self.base = base
        self.sites: dict[tuple[int, ...], list[Any]] = {}  # dropout calls of one forward, per batch shape
        self.fn = torch.func.vmap(one, in_dims=(0, 0, 0), randomness="error")
        self.compiled = torch.compile(self.fn) if compile_ and not _drops(base) else None
        self.sizes: set[int] = set()  # the group sizes K called so far (a new K compiles anew)
        self.new_size, self.note = False, ""
        self.names = [n for n, _ in base.named_parameters()]  # tied weights once, as named_parameters gives them
        # a masked slot's weights: the base's own (seeded, finite; never trained), without gradient
        self.rest = {n: p.detach() for n, p in base.named_parameters()}

    def draw(self, x: torch.Tensor, rngs: list[torch.Tensor | None], precision: str) -> list[torch.Tensor]:
        """Each member's dropout noise for a forward of ``x [K, B, T]``, drawn with its RNG state ``rngs[k]``
        (updated in place; None: the current state), stacked per call; ``[]`` for a model without dropout."""
        if not _drops(self.base):
            return []
        key = tuple(x.shape[1:])
        if key not in self.sites:
            with torch.no_grad(), recorded() as sites, autocast(x.device.type, precision):
                self.base(x[0])
            self.sites[key] = sites
        per_member = []
        for k, rng in enumerate(rngs):
            if rng is not None:
                torch.set_rng_state(rng)
            per_member.append(draw_noise(self.sites[key], x.device))
            if rng is not None:
                rngs[k] = torch.get_rng_state()
        return [torch.stack(n) for n in zip(*per_member)]

    def __call__(self, models: list[torch.nn.Module | None], x: torch.Tensor, noise: list[torch.Tensor]
                 ) -> torch.Tensor:
        own = [dict(m.named_parameters()) if m is not None else self.rest for m in models]
        params = {n: torch.stack([p[n] for p in own]) for n in self.names}
        self.new_size = len(models) not in self.sizes
        self.sizes.add(len(models))
        with quiet_vmap():
            return (self.compiled or self.fn)(params, x, noise)

    def fall_back(self, e: BaseException) -> bool:
        """Whether the failure ``e`` of a compiled forward-and-backward is handled: the first call with a group size
        ``K`` compiles (the first step, and again when a member finishes or diverges), and if that fails the group
        runs the eager function from now on (the caller repeats the micro-batch, the first of its step: K changes
        only between steps); failures of a call that compiled nothing are the model's own, and so are an
        out-of-memory error and an operation without a deterministic kernel (eager would fail the same way)."""
        if self.compiled is None or not self.new_size or not compile_failure(e):
            return False
        self.compiled = None
        self.note = f"the stacked forward runs eager: torch.compile of it failed ({type(e).__name__})"
        return True


def _drops(model: torch.nn.Module) -> bool:
    """Whether ``model`` in training mode drops anything (``model.dropout > 0``: every dropout site shares it)."""
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
