"""normlab.eval.probes and ``normlab probe``: closed forms from constructed models -- uniform logits give ln V on
both copies and recall at the tie-breaking rule's exact rate; an oracle that copies from L tokens back, or looks the
query's value up, scores perfectly; the data are what they claim to be."""

from __future__ import annotations

import json
import math

import pytest
import torch

from normlab.eval.probes import induction, induction_data, recall, recall_data
from tests.helpers import assert_bad_input, normlab

V = 50
BIG = 60.0  # a logit margin at which softmax is one to fp32 precision


def uniform(idx: torch.Tensor) -> torch.Tensor:
    return torch.zeros(*idx.shape, V)


def copier(length: int):
    """Predicts token t+1 as token t+1-L (the induction answer) on the second copy, uniform before."""
    def model(idx):
        out = torch.zeros(*idx.shape, V)
        for t in range(length - 1, idx.shape[1] - 1):
            out[torch.arange(idx.shape[0]), t, idx[:, t + 1 - length]] = BIG
        return out
    return model


def lookup(idx: torch.Tensor) -> torch.Tensor:
    """At the last position, one-hot at the value that followed the query's key earlier in the row."""
    out = torch.zeros(*idx.shape, V)
    for b in range(idx.shape[0]):
        q = idx[b, -1]
        pos = (idx[b, :-1:2] == q).nonzero()[0, 0] * 2
        out[b, -1, idx[b, pos + 1]] = BIG
    return out


def test_induction_data_repeats_uniform_tokens():
    x = induction_data(V, 40, 300, seed=3)
    assert x.shape == (300, 80) and torch.equal(x[:, :40], x[:, 40:])
    counts = torch.bincount(x[:, :40].reshape(-1), minlength=V).float()
    assert counts.min() > 0 and (counts.max() - counts.min()) / counts.mean() < 0.35  # 240 draws per symbol
    assert torch.equal(x, induction_data(V, 40, 300, seed=3))


def test_recall_data_keys_distinct_query_is_a_key_answer_is_its_value():
    idx, ans = recall_data(V, 7, 100, seed=1)
    keys, vals = idx[:, 0:14:2], idx[:, 1:14:2]
    assert (keys < V // 2).all() and (vals >= V // 2).all()
    assert all(len(set(k.tolist())) == 7 for k in keys)
    pos = (keys == idx[:, -1:]).float().argmax(1)
    assert torch.equal(vals[torch.arange(100), pos], ans)


def test_uniform_logits_are_at_chance_on_both_probes():
    ind = induction(uniform, vocab=V, length=12, sequences=8)
    assert ind["first_copy_loss"] == pytest.approx(math.log(V)) == ind["chance_first_copy_loss"]
    assert ind["second_copy_loss"] == pytest.approx(math.log(V)) and ind["induction_gain"] == pytest.approx(0.0)
    rec = recall(uniform, vocab=V, pairs=5, sequences=400, seed=2)
    _, ans = recall_data(V, 5, 400, seed=2)
    assert rec["accuracy"] == pytest.approx((ans == V // 2).float().mean().item())  # ties -> the lowest value id
    assert rec["loss"] == pytest.approx(math.log(V)) and rec["chance_accuracy"] == 1 / (V - V // 2)
    assert abs(rec["accuracy"] - rec["chance_accuracy"]) < 4 * math.sqrt(0.04 * 0.96 / 400)


def test_oracles_score_perfectly():
    ind = induction(copier(12), vocab=V, length=12, sequences=8)
    assert ind["first_copy_loss"] == pytest.approx(math.log(V)) and ind["second_copy_loss"] < 1e-6
    assert ind["induction_gain"] == pytest.approx(math.log(V), abs=1e-5)
    off_by_one = induction(copier(11), vocab=V, length=12, sequences=8)  # copies the wrong distance
    assert off_by_one["second_copy_loss"] > 10
    rec = recall(lookup, vocab=V, pairs=9, sequences=50)
    assert rec["accuracy"] == 1.0 and rec["loss"] < 1e-6


def noisy_copier(length: int):
    """Copies like ``copier`` where the token it copies is divisible by 3 (a third of the positions, varying from
    sequence to sequence), uniform elsewhere: a gain between 0 and ln V with a spread over sequences. It depends on
    the tokens only, so any batching gives the same logits."""
    def model(idx):
        out = torch.zeros(*idx.shape, V)
        for t in range(length - 1, idx.shape[1] - 1):
            src = idx[:, t + 1 - length]
            rows = torch.nonzero(src % 3 == 0)[:, 0]
            out[rows, t, src[rows]] = BIG
        return out
    return model


def test_intervals_are_the_t_and_clopper_pearson_intervals_and_decide_the_comparison_to_chance():
    """The induction gain's interval is the Student-t interval over the sequences' own gains (scipy), the recall
    accuracy's the exact Clopper-Pearson interval (statsmodels' beta method); "above chance" exactly when the
    interval is clear of chance."""
    import numpy as np
    import torch.nn.functional as F
    from scipy import stats
    from statsmodels.stats.proportion import proportion_confint

    from normlab.eval.probes import ABOVE_CHANCE, NOT_ABOVE_CHANCE

    length, n = 12, 30
    ind = induction(noisy_copier(length), vocab=V, length=length, sequences=n)
    idx = induction_data(V, length, n, 0)
    logits = noisy_copier(length)(idx)[:, :-1]  # the same model, same random draws: the same logits
    nll = F.cross_entropy(logits.reshape(-1, V), idx[:, 1:].reshape(-1), reduction="none").view(n, -1).double()
    gains = (nll[:, : length - 1].mean(1) - nll[:, length:].mean(1)).numpy()
    low, high = stats.t.interval(0.95, n - 1, loc=gains.mean(), scale=stats.sem(gains))
    assert ind["induction_gain_ci95"] == pytest.approx([low, high], rel=1e-9)
    assert ind["induction_gain"] == pytest.approx(gains.mean(), rel=1e-9)
    assert ind["vs_chance"] == ABOVE_CHANCE and low > 0
    flat = induction(uniform, vocab=V, length=length, sequences=n)  # gain exactly 0: not above chance
    assert flat["vs_chance"] == NOT_ABOVE_CHANCE and flat["chance_induction_gain"] == 0.0

    for model, seqs in ((uniform, 400), (lookup, 50)):
        rec = recall(model, vocab=V, pairs=5, sequences=seqs, seed=2)
        k = round(rec["accuracy"] * seqs)
        assert rec["correct"] == k
        assert rec["accuracy_ci95"] == pytest.approx(list(proportion_confint(k, seqs, 0.05, method="beta")),
                                                      abs=1e-12)
        above = rec["accuracy_ci95"][0] > rec["chance_accuracy"]
        assert rec["vs_chance"] == (ABOVE_CHANCE if above else NOT_ABOVE_CHANCE)
    assert recall(lookup, vocab=V, pairs=5, sequences=50)["vs_chance"] == ABOVE_CHANCE
    assert recall(uniform, vocab=V, pairs=5, sequences=400, seed=2)["vs_chance"] == NOT_ABOVE_CHANCE
    rec = recall(uniform, vocab=V, pairs=5, sequences=40)
    assert rec["loss_ci95"] == pytest.approx([math.log(V), math.log(V)], abs=1e-6)  # every sequence at ln V (fp32)
    assert np.isfinite(rec["accuracy_ci95"]).all()


def test_a_symbol_set_restricts_the_tokens_and_sets_chance():
    sym = torch.tensor([3, 7, 11, 20, 21, 30, 44, 49])
    ind = induction(uniform, vocab=V, length=10, sequences=6, symbols=sym)
    assert ind["chance_first_copy_loss"] == pytest.approx(math.log(8)) and ind["symbols"] == 8
    assert ind["first_copy_loss"] == pytest.approx(math.log(V))  # uniform over all V ids: above the ln 8 chance
    assert induction(copier(10), vocab=V, length=10, sequences=6, symbols=sym)["second_copy_loss"] < 1e-6
    seen = []
    rec = recall(lambda idx: seen.append(idx) or lookup(idx), vocab=V, pairs=3, sequences=40, symbols=sym)
    assert rec["accuracy"] == 1.0 and rec["chance_accuracy"] == 1 / 4 and rec["num_values"] == 4
    assert set(torch.cat(seen).unique().tolist()) <= set(sym.tolist())


def test_probe_command_on_a_run(run, cache):
    res = json.loads(normlab("probe", str(run), "--sequences", "8", "--json", cache=cache, check=True).stdout)
    ind, rec = res["induction"], res["recall"]
    assert ind["symbols"] == 8  # the tiny preset's Markov source: an alphabet of 8 byte values
    assert ind["chance_first_copy_loss"] == pytest.approx(math.log(8)) and rec["chance_accuracy"] == 1 / 4
    res = json.loads(normlab("probe", str(run), "--sequences", "8", "--symbols", "all", "--json", cache=cache,
                             check=True).stdout)
    ind, rec = res["induction"], res["recall"]
    assert ind["chance_first_copy_loss"] == pytest.approx(math.log(res["vocab"]))
    assert ind["length"] == res["context"] // 2 and 2 * rec["pairs"] + 1 <= res["context"]
    assert 0.0 <= rec["accuracy"] <= 1.0 and rec["chance_accuracy"] == 1 / (res["vocab"] - res["vocab"] // 2)
    assert ind["vs_chance"] in ("above chance", "not above chance") and len(rec["accuracy_ci95"]) == 2
    text = normlab("probe", str(run), "--sequences", "4", cache=cache, check=True).stdout
    assert "chance ln 8" in text and "chance 1/4" in text
    lines = text.splitlines()  # each measure leads its block with its interval and its comparison to chance
    assert lines[0].startswith("induction gain ") and "95% CI" in lines[0] and "chance" in lines[0]
    assert lines[2].startswith("associative recall accuracy ") and "95% CI" in lines[2]


@pytest.mark.parametrize("args, fragment", [(["--length", "100000"], "--length"), (["--pairs", "0"], "--pairs"),
                                            (["--length", "1"], "--length")])
def test_probe_bad_input_is_one_line(run, cache, args, fragment):
    assert_bad_input(normlab("probe", str(run), *args, cache=cache), fragment)


# -- a sweep with diag.probes: stored probes, and the report's section from them ---------------------------------
@pytest.fixture(scope="module")
def probe_sweep(tmp_path_factory, cache):
    """Two variants x two seeds of the tiny preset, inline; ``pre`` with ``diag.probes: true``, ``qk`` with it too,
    ``off`` without (nothing stored)."""
    import os

    from normlab.experiments.sweepdir import run_sweep
    from normlab.experiments.sweep import parse_sweep

    d = tmp_path_factory.mktemp("probe-sweep")
    fast = {"train.steps": 12, "train.eval_every": 6, "train.eval_batches": 2, "train.log_every": 3,
            "train.checkpoint_every": 6, "train.track": [], "diag.probes": True}
    spec = {"name": "probes", "base": "tiny", "set": fast, "seeds": [0, 1],
            "variants": [{"name": "pre", "set": {}}, {"name": "qk", "set": {"model.qk_norm": True}},
                         {"name": "off", "set": {"diag.probes": False}}]}
    old = os.environ.get("NORMLAB_CACHE_DIR")
    os.environ["NORMLAB_CACHE_DIR"] = str(cache)
    try:
        out = run_sweep(parse_sweep(spec), d / "out", workers=1, threads=1, inline=True, log=lambda s: None)
    finally:
        os.environ.pop("NORMLAB_CACHE_DIR") if old is None else os.environ.__setitem__("NORMLAB_CACHE_DIR", old)
    assert out.status == "completed"
    return d / "out"


def test_a_sweep_stores_exactly_what_normlab_probe_measures(probe_sweep, cache):
    from normlab.rundir.files import PROBES_FILE

    for rid in ("pre-s0", "qk-s1"):
        stored = json.loads((probe_sweep / "runs" / rid / PROBES_FILE).read_text())
        cli = json.loads(normlab("probe", str(probe_sweep / "runs" / rid), "--json", cache=cache, check=True).stdout)
        assert stored["induction"] == cli["induction"] and stored["recall"] == cli["recall"]  # exact, not approx
        assert stored["settings"] == {"length": None, "pairs": None, "sequences": 64, "seed": 0, "symbols": "data",
                                      "batch_size": 16}
        assert "run_dir" not in stored  # stored results name no machine path
    assert not (probe_sweep / "runs" / "off-s0" / PROBES_FILE).exists()  # diag.probes off: nothing measured


def test_a_stacked_group_stores_its_members_probes(tmp_path, cache, monkeypatch):
    """The stacked path (one model for a variant's seeds, normlab.train.stacked) probes each member as the worker
    does a run alone: what normlab probe measures on its run directory."""
    from normlab.experiments.sweepdir import run_sweep
    from normlab.experiments.sweep import parse_sweep
    from normlab.rundir.files import PROBES_FILE

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    spec = {"name": "stk", "base": "tiny", "seeds": [0, 1],
            "set": {"train.steps": 6, "train.eval_every": 6, "train.eval_batches": 2, "train.checkpoint_every": 6,
                    "model.width": 32, "model.context": 32, "train.batch_size": 4, "train.precision": "fp32",
                    "train.compile": False, "train.track": [], "diag.probes": True}}
    logs: list[str] = []
    out = run_sweep(parse_sweep(spec), tmp_path / "s", workers=1, threads=1, inline=True, stack="on",
                    log=logs.append)
    assert out.status == "completed" and any("1 group(s) of 2 runs stacked" in m for m in logs), logs
    for r in out.runs:
        d = tmp_path / "s" / "runs" / r["run_id"]
        stored = json.loads((d / PROBES_FILE).read_text())
        cli = json.loads(normlab("probe", str(d), "--json", cache=cache, check=True).stdout)
        assert stored["induction"] == cli["induction"] and stored["recall"] == cli["recall"]


def test_diag_probes_off_leaves_the_config_hash_as_before():
    """At its default the key is not part of the identity (runs from before keep their hashes); on, it is."""
    from normlab.config import config_from_dict

    off, on = config_from_dict({}), config_from_dict({"diag": {"probes": True}})
    assert "probes" not in off.identity_dict()["diag"] and off.to_dict()["diag"]["probes"] is False
    assert on.identity_dict()["diag"]["probes"] is True and on.hash() != off.hash()


def test_report_section_shows_chance_and_per_variant_values_from_the_stored_probes(probe_sweep):
    """The report's "In-context probes" table: per variant, mean ± the 95% t half-width over the two seeds of the
    numbers in probes.json (computed here by hand with scipy's t quantile), and the chance levels ln 8 and 1/4."""
    from scipy import stats as sps

    from normlab.report.render import write_report

    write_report(probe_sweep)
    md = (probe_sweep / "report.md").read_text()
    html = (probe_sweep / "report.html").read_text()
    part = md.split("## In-context probes", 1)[1].split("\n## ", 1)[0]
    assert "In-context probes" in html and "ln 8 = 2.079" in part and "1/4 = 0.2500" in part
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]] for ln in part.splitlines()
            if ln.startswith("| ") and not ln.startswith(("| variant", "| :", "| -"))}
    assert set(rows) == {"pre", "qk"}  # 'off' stored none
    for name, cells in rows.items():
        recs = [json.loads((probe_sweep / "runs" / f"{name}-s{s}" / "probes.json").read_text()) for s in (0, 1)]
        for col, get in ((1, lambda r: r["induction"]["first_copy_loss"]),
                         (3, lambda r: r["induction"]["induction_gain"]), (5, lambda r: r["recall"]["accuracy"])):
            a, b = (get(r) for r in recs)
            half = sps.t.ppf(0.975, 1) * (abs(a - b) / math.sqrt(2)) / math.sqrt(2)  # t * sd / sqrt(n), n = 2
            assert cells[col] == f"{(a + b) / 2:.3f} ± {half:.3f}", (name, col, cells)
        assert cells[0] == "2"
