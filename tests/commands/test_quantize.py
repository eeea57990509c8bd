"""normlab.commands.quantize ``--json``: one strict JSON object on stdout even where a statistic is not finite (a
run whose weights are all zero: every activation is 0, so its outlier ratio absmax / median is inf; printed as
bare ``Infinity`` before, now null as in quantization.json); a finite result prints the same numbers as the file."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from tests.helpers import run_inproc


def _strict(text: str):
    def bare(name: str):
        raise AssertionError(f"bare {name} in --json output")

    return json.loads(text, parse_constant=bare)


def test_json_is_strict_when_a_statistic_is_infinite(run_copy, tmp_path, cache):
    w = load_file(str(run_copy / "model.safetensors"))
    save_file({k: torch.zeros_like(v) for k, v in w.items()}, str(run_copy / "model.safetensors"))
    proc = run_inproc("quantize", str(run_copy), "--weights", "8", "--out", str(tmp_path / "q"),
                      "--max-tokens", "256", "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1
    got = _strict(proc.stdout)
    stored = json.loads((tmp_path / "q" / "quantization.json").read_text())
    assert got["max_act_outlier_ratio"] is None and stored["max_act_outlier_ratio"] is None
    assert [layer["act"]["outlier_ratio"] for layer in got["layers"].values()] == [None] * len(got["layers"])
    assert got["layers"] == stored["layers"]


def test_json_of_a_trained_run_equals_the_written_record(run, tmp_path, cache):
    proc = run_inproc("quantize", str(run), "--weights", "8", "--out", str(tmp_path / "q"), "--max-tokens", "256",
                      "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    got = _strict(proc.stdout)
    stored = json.loads((tmp_path / "q" / "quantization.json").read_text())
    assert got["bpb_after"] == stored["bpb_after"] and got["bpb_before"] == stored["bpb_before"]
