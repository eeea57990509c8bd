"""A run's config completed in one place: what the config leaves open is filled once, here, and every later stage
of training (model, optimizer, data order, diagnostics, checkpoints, summary) reads the result, frozen.

Completion, in the order a run meets it:

- before this module: a new run's config is built by ``normlab.config.new_config`` / ``load_config`` (missing keys
  their defaults, then the norms' run-dependent defaults, ``apply_norm_defaults``: PowerNorm's and Unified
  Normalization's ``warmup`` = ``train.warmup_steps``), which the run folder's name, ``normlab config`` and
  ``--init-from``'s check read; a stored config is read back by ``normlab.config.stored_config`` and never completed
  again; a sweep's planned configs are built uncompleted (their hashes are the sweep file's);
- :func:`resolve_group` / :func:`resolve_run` -- at the start of training, with the token splits and this machine:
  ``model.vocab_size`` from the data, the norm defaults (a sweep's planned config meets them here; a new run's
  already has them: the completion is idempotent), the checks (``RunConfig.validate``, memory against the device
  the run trains on: a CUDA device's free memory from ``torch.cuda.mem_get_info``, else the host's), the thread
  count, then ``device`` / ``train.precision`` / ``train.compile`` / ``train.tf32`` / deterministic kernels
  (``normlab.train.precision.resolve_runtime``). The caller's config is completed in place (``config.yaml`` records
  what the run used, as before) and a frozen copy (:func:`freeze`: setting a key raises) is what training reads.
- :func:`resumed` -- ``--resume`` with a config: the config completed as the run's ``config.yaml`` was (its
  vocab_size, the norm defaults, and each ``auto`` the value the run resolved: :func:`fill_auto`), to compare the
  two.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from normlab.config import RunConfig, apply_norm_defaults
from normlab.errors import NormlabError
from normlab.train.precision import resolve_device, resolve_runtime
from normlab.train.threads import resolve_threads, step_flops
from normlab.validate import check_train_memory


@dataclass(frozen=True)
class Resolved:
    """One run's config as training reads it: ``cfg`` (frozen, every ``auto`` replaced), the banner's runtime
    lines (device, precision, compile, deterministic, tf32 decisions with their reasons) and why the thread count."""

    cfg: RunConfig
    runtime: tuple[str, ...]
    why_threads: str


def resumed(base: RunConfig, saved: RunConfig) -> RunConfig:
    """``base`` (a config handed to ``--resume``) completed, in place, as the run's own ``saved`` config was: its
    vocab_size, the norm defaults, and ``saved``'s resolved value wherever ``base`` says ``auto``; returned."""
    base.model.vocab_size = saved.model.vocab_size
    apply_norm_defaults(base)
    fill_auto(base, saved)
    return base


def fill_auto(cfg: RunConfig, resolved: RunConfig) -> None:
    """Where ``cfg`` says ``auto``, take ``resolved``'s value (``--resume`` with a config: a run's config.yaml
    records the resolved values, which an ``auto`` in the same config matches)."""
    if cfg.device == "auto":
        cfg.device = resolved.device
    for key in ("precision", "compile", "tf32", "deterministic"):
        if getattr(cfg.train, key) == "auto":
            setattr(cfg.train, key, getattr(resolved.train, key))


def device_memory(device: str) -> tuple[int, str] | None:
    """``(free bytes, where)`` of the CUDA device a run trains on (``torch.cuda.mem_get_info``: the driver's free
    memory of the current device, what other processes hold already taken off), None for the CPU (the host's
    available memory is the check's default)."""
    if device != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info()
    return free, f"the CUDA device ({torch.cuda.get_device_name()}) has"


def resolve_group(cfgs: list[RunConfig], datas: list[Any], *, threads: int | None = None) -> list[Resolved]:
    """Complete and check ``cfgs`` (one run, or the members of one stacked group: one shape) with their token
    splits ``datas`` on this machine, in place, in a fixed order (nothing is allocated or written before the checks
    pass; the thread count is set before the precision probe, which measures at it): vocab_size and the norm
    defaults, ``validate``, the memory of the whole group on the run's device, the thread count (``threads``: a
    caller's plan, over ``train.threads``), then the runtime. Returns each run's :class:`Resolved`."""
    for cfg, data in zip(cfgs, datas):
        cfg.model.vocab_size = data.vocab_size
        apply_norm_defaults(cfg)
        cfg.validate()
    first = cfgs[0]
    device, _ = resolve_device(first.device)
    check_train_memory(first, members=len(cfgs), available=device_memory(device))
    n_threads, why_threads = resolve_threads(first.train.threads, step_flops(first), override=threads)
    if n_threads:
        torch.set_num_threads(n_threads)
    runtimes = [tuple(resolve_runtime(c)) for c in cfgs]  # the members resolve alike: same shape and keys
    return [Resolved(freeze(c), r, why_threads) for c, r in zip(cfgs, runtimes)]


def resolve_run(cfg: RunConfig, data: Any, *, threads: int | None = None) -> Resolved:
    """:func:`resolve_group` of one run."""
    return resolve_group([cfg], [data], threads=threads)[0]


# ---------------------------------------------------------------------------------------------------- frozen
def _refuse(self: Any, name: str, value: Any = None) -> None:
    raise NormlabError(f"the resolved config is frozen: {type(self).__name__.removeprefix('Frozen')}.{name} cannot "
                       "change after the run's config was resolved (normlab.train.resolve)")


_FROZEN: dict[type, type] = {}


def _frozen_class(cls: type) -> type:
    if cls not in _FROZEN:
        _FROZEN[cls] = type(f"Frozen{cls.__name__}", (cls,), {"__setattr__": _refuse, "__delattr__": _refuse,
                                                               "__module__": cls.__module__})
    return _FROZEN[cls]


def freeze(cfg: RunConfig) -> RunConfig:
    """A deep copy of ``cfg`` whose sections refuse to be set (a ``NormlabError`` naming the key): still a
    ``RunConfig`` for every reader (``to_dict``, ``hash``, attributes), but a later stage cannot change what the
    run resolved. Mappings inside (``model.norm_options``) are copies."""
    out = copy.deepcopy(cfg)
    for f in dataclasses.fields(out):
        section = getattr(out, f.name)
        if dataclasses.is_dataclass(section):
            object.__setattr__(section, "__class__", _frozen_class(type(section)))
    object.__setattr__(out, "__class__", _frozen_class(type(out)))
    return out
