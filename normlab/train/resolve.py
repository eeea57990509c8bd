"""A run's config completed in one place: what the config leaves open is filled once, here, and every later stage
of training (model, optimizer, data order, diagnostics, checkpoints, summary) reads the result, frozen.

Three completions, in the order a run meets them:

- :func:`declared` -- what needs neither data nor machine: the norms' run-dependent defaults
  (``apply_norm_defaults``: PowerNorm's and Unified Normalization's ``warmup`` = ``train.warmup_steps``). The run
  folder's name, ``normlab config`` and ``--init-from``'s check read the config after it.
- :func:`resolve_group` / :func:`resolve_run` -- at the start of training, with the token splits and this machine:
  ``model.vocab_size`` from the data, the norm defaults, the checks (``RunConfig.validate``, memory against the
  device the run trains on: a CUDA device's free memory from ``torch.cuda.mem_get_info``, else the host's), the
  thread count, then ``device`` / ``train.precision`` / ``train.compile`` / ``train.tf32`` / deterministic kernels
  (``normlab.train.precision.resolve_runtime``). The caller's config is completed in place (``config.yaml`` records
  what the run used, as before) and a frozen copy (:func:`freeze`: setting a key raises) is what training reads.
- :func:`resumed` -- ``--resume`` with a config: the config completed as the run's ``config.yaml`` was (its
  vocab_size, the norm defaults, and each ``auto`` the value the run resolved), to compare the two.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from normlab.config import RunConfig
from normlab.errors import NormlabError
from normlab.rundir.readers import apply_norm_defaults
from normlab.train.precision import fill_auto, resolve_device, resolve_runtime
from normlab.train.threads import resolve_threads, step_flops
from normlab.validate import check_train_memory


@dataclass(frozen=True)
class Resolved:
    """One run's config as training reads it: ``cfg`` (frozen, every ``auto`` replaced), the banner's runtime
    lines (device, precision, compile, deterministic, tf32 decisions with their reasons) and why the thread count."""

    cfg: RunConfig
    runtime: tuple[str, ...]
    why_threads: str


def declared(cfg: RunConfig) -> RunConfig:
    """``cfg`` completed, in place, by what needs no data or machine (the norms' defaults); returned."""
    apply_norm_defaults(cfg)
    return cfg


def resumed(base: RunConfig, saved: RunConfig) -> RunConfig:
    """``base`` (a config handed to ``--resume``) completed, in place, as the run's own ``saved`` config was: its
    vocab_size, the norm defaults, and ``saved``'s resolved value wherever ``base`` says ``auto``; returned."""
    base.model.vocab_size = saved.model.vocab_size
    declared(base)
    fill_auto(base, saved)
    return base


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
        declared(cfg)
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
