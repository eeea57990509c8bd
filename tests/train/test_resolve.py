"""normlab.train.resolve: a run's config completed once (data, norms, machine) into a frozen config; memory checked
against the device the run trains on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import normlab.train.resolve as resolve
from normlab.config import load_config
from normlab.errors import NormlabError

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(*overrides: str):
    return load_config("tiny", ["device=cpu", "train.precision=fp32", "train.compile=false", *overrides])


def test_resolved_config_is_frozen_and_the_callers_config_completed_in_place():
    cfg = _cfg("model.norm=powernorm", "train.warmup_steps=7")
    r = resolve.resolve_run(cfg, SimpleNamespace(vocab_size=259))
    assert cfg.model.vocab_size == 259 and cfg.model.norm_options["warmup"] == 7  # data and norm defaults, in place
    assert r.cfg.to_dict() == cfg.to_dict() and r.cfg.hash() == cfg.hash()
    assert r.cfg is not cfg and r.cfg.model.norm_options is not cfg.model.norm_options
    for section, key in ((r.cfg.train, "lr"), (r.cfg.model, "vocab_size"), (r.cfg, "seed")):
        with pytest.raises(NormlabError, match=f"frozen: .*{key} cannot change"):
            setattr(section, key, 1)
    assert r.cfg.train.lr == cfg.train.lr  # unchanged by the refused writes
    assert any(line.startswith("device cpu") for line in r.runtime)


def test_resumed_takes_the_runs_resolved_values_where_the_config_says_auto():
    saved = _cfg()
    saved.model.vocab_size = 300
    base = load_config("tiny", [])  # device, precision, compile: auto
    resolve.resumed(base, saved)
    assert (base.device, base.train.precision, base.train.compile, base.model.vocab_size) == ("cpu", "fp32", False, 300)


def test_device_memory_reads_the_cuda_devices_free_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (3 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake H100")
    assert resolve.device_memory("cuda") == (3 * 2**30, "the CUDA device (Fake H100) has")
    assert resolve.device_memory("cpu") is None


def test_a_run_that_does_not_fit_the_gpus_free_memory_is_refused_before_the_runtime(monkeypatch):
    """The host has plenty of memory (the check's default would pass); the device's free memory refuses the run,
    before the runtime (which would need a real CUDA device) is resolved."""
    monkeypatch.setattr(resolve, "resolve_device", lambda name: ("cuda", "test"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (2**20, 80 * 2**30))  # 1 MiB free
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake H100")
    monkeypatch.setattr(resolve, "resolve_runtime", lambda c: pytest.fail("runtime resolved before the memory check"))
    with pytest.raises(NormlabError, match=r"needs an estimated .* but the CUDA device \(Fake H100\) has 0.000977 GiB"):
        resolve.resolve_run(_cfg(), SimpleNamespace(vocab_size=259))
