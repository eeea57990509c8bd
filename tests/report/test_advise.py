"""normlab.report.advise and ``normlab advise``: claims sorted by their own verdicts, distances in scale against the
closed-form parameter count, comparisons at equal steps and equal FLOPs against hand-computed interpolations, the
next question's rule, and the written sweep parsed by the project's sweep parser."""

from __future__ import annotations

import json
import pytest

from normlab.errors import NormlabError
from normlab.experiments.sweep import load_sweep
from normlab.report import advise as A
from normlab.report.evidence import load_evidence
from tests.helpers import assert_bad_input, run_inproc as normlab


def _claim(**kw):
    base = {"name": "x", "verdict": "held", "p_adj": 0.01, "test": "t", "measured": 0.3, "ci": [0.2, 0.4]}
    return base | kw


@pytest.mark.parametrize("kw, want", [
    ({}, "decided"),
    ({"p_adj": 0.05}, "decided"),
    # the suite's verdict is the decision, by its own rule: a margin decided by its equivalence test, a collapse
    # rate apart, whatever the t-test's p (before, these read as undecided)
    ({"verdict": "within margin", "p_adj": 1.0}, "decided"),
    ({"test": "collapse", "verdict": "held", "p_adj": 0.3}, "decided"),
    ({"verdict": "inconclusive", "p_adj": 0.001}, "undecided"),  # the suite's verdict wins over a small p
    ({"verdict": "not held", "p_adj": 0.009}, "decided"),
    ({"verdict": "not observable at this scale", "p_adj": 0.001}, "not observable"),
    ({"test": "exact", "verdict": "held", "p_adj": None}, "decided"),
    # a definition revised after a verdict on the same seeds: exploratory, never decided (not observable stays)
    ({"exploratory": True}, "undecided"),
    ({"exploratory": True, "test": "exact", "p_adj": None}, "undecided"),
    ({"exploratory": True, "verdict": "not observable at this scale"}, "not observable"),
    ({"current_definition": False}, "undecided"),  # measured under a definition revised since
])
def test_status_is_the_suite_verdict_of_a_current_confirmatory_definition(kw, want):
    assert A.status(_claim(**kw)) == want


def _ln_params(width: int, depth: int) -> int:
    """Pre-LN GPT without biases, MLP ratio 4: 12 L d^2 matrix weights + (2 L + 1) LayerNorms of 2 d."""
    return 12 * depth * width ** 2 + (2 * depth + 1) * 2 * width


def test_distance_is_the_ratio_of_closed_form_parameters_and_of_tokens():
    scale = A.parse_scale("width 64, 4 blocks, 500 steps, 512k tokens; width 64, 12 blocks, 500 steps, 512k tokens")
    assert scale == [{"width": 64, "depth": 4, "steps": 500, "tokens": 512_000},
                     {"width": 64, "depth": 12, "steps": 500, "tokens": 512_000}]
    target = {"params": _ln_params(768, 12), "tokens": 10**9}
    d = A.distance(target, scale[0], {"heads": 4, "context": 64})
    assert d["params"] == _ln_params(64, 4)
    assert d["params_factor"] == pytest.approx(_ln_params(768, 12) / _ln_params(64, 4))
    assert d["tokens_factor"] == pytest.approx(10**9 / 512_000) and d["far"]
    near = A.distance({"params": _ln_params(64, 8), "tokens": 2_000_000}, scale[0], {"heads": 4, "context": 64})
    assert not near["far"]  # ~2x parameters, ~3.9x tokens


def test_a_sweep_verdict_that_flips_at_equal_flops_is_flagged(monkeypatch, tmp_path):
    from tests.report.test_equal_flops import flipping_runs
    import normlab.report.rundirs as rd

    monkeypatch.setattr(rd, "collect", lambda paths: [(r, None) for r in flipping_runs()])
    res = A.sweep_comparisons(tmp_path, baseline="cheap")
    assert res["sweep"] == str(tmp_path) and res["comparisons"][0]["changed"]
    assert res["probes"] == [] and res["probes_missing"] == []  # no stored runs to read probes from


def test_a_sweeps_stored_probes_are_printed_per_variant_beside_chance():
    """The rows normlab.report.probes computes (mean ± t half-width over seeds) in advise's text, chance included."""
    ci = lambda m, h: {"mean": m, "half": h, "n": 3}
    row = {"variant": "QK-norm", "n": 3, "first_copy_loss": ci(2.625, 0.231), "second_copy_loss": ci(2.609, 0.243),
           "induction_gain": ci(0.016, 0.019), "accuracy": ci(0.193, 0.125), "chance_first_copy_loss": 2.0794415,
           "chance_accuracy": 0.25, "symbols": 8}
    lines = A._probe_lines({"probes": [row], "probes_missing": ["qk-norm-s3: too long for the context"]})
    assert lines == ["  probes QK-norm (n 3): induction gain 0.016 ± 0.019 nats (first copy 2.625 ± 0.231, chance "
                     "ln 8 = 2.079); recall accuracy 0.193 ± 0.125 (chance 1/4 = 0.2500)",
                     "  probes not measured: qk-norm-s3: too long for the context"]


def test_next_question_prefers_contested_then_decided_far_then_undecided():
    def e(name, status, contested=False, far=True, m=0.3):
        return {"name": name, "status": status, "contested": contested, "measured": m, "ci95": [m - 0.1, m + 0.1],
                "distance": {"far": far}}
    assert A.next_question([e("dyt-vs-ln", "undecided"), e("peri-lr-sensitivity", "decided"),
                            e("qk-lr-sensitivity", "decided", contested=True)])["claim"] == "qk-lr-sensitivity"
    assert A.next_question([e("dyt-vs-ln", "undecided", m=5.0), e("peri-lr-sensitivity", "decided", m=0.1)]
                           )["claim"] == "peri-lr-sensitivity"
    assert A.next_question([e("cod-growth", "decided")]) is None  # no recipe


def test_gpt2_small_answer_states_only_what_the_evidence_decides(tmp_path, cache):
    out = tmp_path / "next.yaml"
    p = normlab("advise", "--width", "768", "--depth", "12", "--context", "1024", "--tokens", "1e9", "--json",
                "--write", str(out), cache=cache, check=True)
    res = json.loads(p.stdout)
    t = res["target"]
    assert t["params"] == _ln_params(768, 12) and t["heads"] == 12
    assert t["steps"] == -(-10**9 // (16 * 1024)) and t["tokens"] >= 10**9
    claims = {c["name"]: c for c in load_evidence()["claims"]}
    for d in res["decisions"]:
        # nothing was measured within 10x of GPT-2 small: a decision is "decided at <scale>, untested at yours"
        assert d["decided"] == [] and d["sure"] in ("leaning", "unknown")
        assert d["sure"] == ("leaning" if d["decided_elsewhere"] else "unknown")
        for e in d["decided_elsewhere"]:
            c = claims[e["name"]]
            assert e["status"] == "decided elsewhere" and e["status_text"].endswith("untested at yours")
            assert e["status_text"].startswith(f"decided at {c['scale']}")
            assert e["distance"]["far"] and "more than 10x" in e["applies"]
            suite_decided = c["verdict"] in ("held", "not held", "within margin") and not c["exploratory"] and (
                c["test"] == "exact" or c["p_adj"] <= 0.05 or c["verdict"] == "within margin")
            assert suite_decided or e["replicated_on"] or e["contradicted_on"]
            assert not e["contested"]
        for e in d["undecided"]:
            c = claims[e["name"]]
            assert c["verdict"] not in ("held", "not held", "within margin") or c["exploratory"], c
            assert ("exploratory" in e["verdict"]) == bool(c["exploratory"] or c.get("exploratory_result"))
            assert ("exploratory: revised" in e["verdict"]) == c["exploratory"]
    # the claims decided only on a fresh seed block (exploratory on seeds 0-4): the confirmation's (6000-6004), the
    # follow-up's (7000-7011) and the decision layer's re-run (9100-9104)
    confirmed = {e["name"]: e for d in res["decisions"] for e in d["decided_elsewhere"] if claims[e["name"]].get(
        "exploratory_result")}
    assert set(confirmed) == {"mixln-grad", "linear-attention", "lssar-extrapolation", "peri-variance-magnitude",
                              "peri-lr-sensitivity", "postln-lr-sensitivity", "qk-lr-sensitivity"}
    blocks = {"mixln-grad": "6000-6004", "linear-attention": "6000-6004", "lssar-extrapolation": "7000-7011"}
    for n, e in confirmed.items():
        assert e["decided_on"] == [f"pystdlib (claims suite, seeds {blocks.get(n, '9100-9104')})"]
        assert "on seeds 0-4, which its revision saw" in e["verdict"] or n == "lssar-extrapolation"
    # the follow-up's claim: decided on its 12 seeds, the 5-seed confirmation it supersedes named
    lssar = confirmed["lssar-extrapolation"]
    assert "superseding the confirmation on seeds 6000-6004: inconclusive" in lssar["verdict"]
    # the state claims present at initialisation are not decided (not a training effect)
    assert {"cod-growth", "cod-lns"} <= {e["name"] for d in res["decisions"] for e in d["undecided"]}
    assert "postln-warmup" in {e["name"] for d in res["decisions"] for e in d["undecided"]}
    assert res["evidence"]["follow_ups"] == {"claims-followup-2026-11-28.json": "claims-confirm-2026-11-28.json"}
    sweep = load_sweep(out)  # the project's own parser: `normlab compare` accepts it
    nxt = res["next"]
    assert len(sweep.runs) == nxt["estimate"]["runs"] == 2 * 5 * 4
    assert nxt["estimate"]["gpu"] == "not measured" and nxt["estimate"]["seconds_here"] > 0
    text = normlab("advise", "--width", "768", "--depth", "12", "--context", "1024", "--tokens", "1e9", "--no-write",
                   cache=cache, check=True).stdout
    assert "untested at yours" in text and "nothing below is decided at your scale" in text
    assert text.index("Bottom line") < text.index("== hidden-state norm")
    # the packaged scaling fits (docs/scaling-2026-11-26.json: widths 32-96, depth 4, 2 tokens per parameter) are
    # all degenerate and end at N = 444,096: they do not reach 85M parameters at 11.7 tokens per parameter
    sc = res["scaling_fits"]
    assert sc["n_max"] == _ln_params(96, 4) == 444_096
    assert sc["params_over_largest"] == pytest.approx(t["params"] / 444_096) and sc["far"]
    assert sc["tokens_per_param"] == pytest.approx(t["tokens"] / t["params"])
    assert not sc["reaches_any"] and all(f["degenerate"] for f in sc["fits"].values())
    assert "they do not reach your model" in text and "the fits are along 2 tokens per parameter" in text


@pytest.mark.parametrize("args, fragment", [
    (["--tokens", "lots"], "--tokens"),
    (["--tokens", "1e9", "--steps", "10"], "not allowed with"),
    (["--width", "0"], "--width"),
    (["--width", "100", "--heads", "3"], "model.width"),
    (["--optimizer", "adamq"], "optim.name"),
    (["--from", "nowhere"], "not a sweep directory"),
])
def test_bad_input_is_one_line(args, fragment, cache, tmp_path):
    assert_bad_input(normlab("advise", "--no-write", *args, cache=cache), fragment)


def test_a_run_directory_is_the_target_and_its_own_training_rate_times_the_sweep(run, cache, tmp_path):
    s = json.loads((run / "summary.json").read_text())
    res = json.loads(normlab("advise", str(run), "--json", "--write", str(tmp_path / "n.yaml"), cache=cache,
                             check=True).stdout)
    est = res["next"]["estimate"]
    assert est["rate_flops_per_s"] == pytest.approx(s["tokens_per_s"] * s["flops_per_token"])
    assert "own training" in est["rate_source"]
    assert res["target"]["flops_per_token"] == s["flops_per_token"] and res["target"]["steps"] == s["steps"]
    assert load_sweep(tmp_path / "n.yaml").runs[0].config["model"]["width"] == res["target"]["width"]


def test_a_claim_confirmed_on_a_fresh_block_is_decided_there_with_its_exploratory_verdict_beside():
    """A record the evidence took from a confirmation run (seeds no revision saw) is decided as any confirmatory
    record; its line names the block it was decided on and the exploratory verdict on the seeds its revision saw."""
    ev = {"suite": {"corpus": "pystdlib", "seeds": 5, "heads": 4, "context": 64}, "replications": []}
    rec = _claim(name="mixln-grad", claim="c", paper="p", metric="m", exploratory=False,
                 seeds=[1000, 1001, 1002, 1003, 1004], scale="width 64, 12 blocks, 500 steps, 512k tokens",
                 exploratory_result={"verdict": "held", "seeds": [0, 1, 2, 3, 4]})
    e = A._claim_entry(rec, {"params": _ln_params(64, 12), "tokens": 512_000}, ev)
    assert e["status"] == "decided" and e["decided_on"] == ["pystdlib (claims suite, seeds 1000-1004)"]
    assert e["verdict"] == ("held on seeds 1000-1004, a fresh block (on seeds 0-4, which its revision saw: held, "
                            "exploratory)")
    # a follow-up's record: decided on its own larger block, the confirmation it supersedes named beside
    fol = A._claim_entry({**rec, "seeds": list(range(7000, 7012)), "superseded_confirmation": {
        "verdict": "inconclusive", "seeds": [1000, 1001, 1002, 1003, 1004]}},
        {"params": _ln_params(64, 12), "tokens": 512_000}, ev)
    assert fol["status"] == "decided" and fol["decided_on"] == ["pystdlib (claims suite, seeds 7000-7011)"]
    assert fol["verdict"] == ("held on seeds 7000-7011, a fresh block (on seeds 0-4, which its revision saw: held, "
                              "exploratory); superseding the confirmation on seeds 1000-1004: inconclusive")
    # a claim a revision saw on every block: the exploratory results of the fresh blocks it saw too, named beside
    seen = A._claim_entry({**rec, "exploratory": True, "exploratory_result": None, "seeds": [0, 1, 2, 3, 4],
                           "exploratory_elsewhere": [{"verdict": "not held", "seeds": list(range(6000, 6005))},
                                                     {"verdict": "inconclusive", "seeds": list(range(7000, 7012))}]},
                          {"params": _ln_params(64, 12), "tokens": 512_000}, ev)
    assert seen["verdict"] == ("held, exploratory: revised after a verdict on these seeds; on seeds 6000-6004, also "
                               "seen by its revision: not held, exploratory; on seeds 7000-7011, also seen by its "
                               "revision: inconclusive, exploratory")
    alone = A._claim_entry(_claim(name="x", claim="c", paper="p", metric="m", seeds=[0, 1, 2, 3, 4],
                                  scale="width 64, 4 blocks, 500 steps, 512k tokens"),
                           {"params": _ln_params(64, 4), "tokens": 512_000}, ev)
    assert alone["verdict"] == "held" and alone["decided_on"] == ["pystdlib (claims suite, seeds 0-4)"]


def test_write_never_overwrites_a_file_advise_did_not_write(cache, tmp_path):
    """--write replaces only its own earlier output (first line SWEEP_HEADER); a user's file, a directory or a FIFO
    there is one line and stays as it was."""
    import os

    mine = tmp_path / "config.yaml"
    mine.write_text("model: {width: 64}\n")
    assert_bad_input(normlab("advise", "--write", str(mine), cache=cache),
                     "exists and was not written by normlab advise")
    assert mine.read_text() == "model: {width: 64}\n"
    os.mkfifo(tmp_path / "fifo")
    assert_bad_input(normlab("advise", "--write", str(tmp_path / "fifo"), cache=cache), "not written by normlab")
    out = tmp_path / "next.yaml"
    for _ in range(2):  # its own output is replaced
        normlab("advise", "--write", str(out), cache=cache, check=True)
        assert out.read_text().splitlines()[0] == A.SWEEP_HEADER
    assert load_sweep(out).runs


def test_the_next_question_runs_on_a_seed_block_no_stored_evidence_used():
    """A next question that was run and packaged (its replications document) is asked again on the next fresh block
    of SEED_BLOCK seeds; the range's end is one line."""
    from normlab.report.advise import SEED_BLOCK, SEED_RANGE, next_seeds

    first = list(range(SEED_RANGE.start, SEED_RANGE.start + SEED_BLOCK))
    assert next_seeds({"replications": [{"seeds": [1000, 1001]}]}) == first
    ran = {"replications": [{"seeds": first}, {"seeds": [first[-1] + 2]}]}
    assert next_seeds(ran) == [s + 2 * SEED_BLOCK for s in first]  # the second block shares one seed: skipped too
    with pytest.raises(NormlabError, match="every seed block"):
        next_seeds({"replications": [{"seeds": list(SEED_RANGE)}]})


def test_a_replication_line_names_the_scale_it_was_measured_at():
    from normlab.report.advise import _replications

    r = {"corpus": "pystdlib", "seeds": [8000, 8003], "command": "normlab compare advise-sweep.yaml",
         "contrast": "Post-LN - Pre-LN", "estimate": 0.25, "half_width": 0.1, "p_adj": 0.01, "reading": "higher",
         "claim_side": True, "scale": "width 128, 4 blocks, 600 steps, 1.23M tokens"}
    assert _replications({"replications": [r, {**r, "scale": None}]}) == [
        "    replication on pystdlib at width 128, 4 blocks, 600 steps, 1.23M tokens (seeds 8000-8003, `normlab "
        "compare advise-sweep.yaml`): Post-LN - Pre-LN +0.25 ± 0.1, Holm p 0.01: higher (the claim side)",
        "    replication on pystdlib (seeds 8000-8003, `normlab compare advise-sweep.yaml`): Post-LN - Pre-LN +0.25 "
        "± 0.1, Holm p 0.01: higher (the claim side)"]


def test_advise_json_is_strict_and_text_escapes_control_characters(monkeypatch, tmp_path):
    """Evidence with a non-finite number gives strict JSON (null), not a ValueError traceback from
    ``allow_nan=False``; a verdict or corpus with control characters reaches the terminal as escapes."""
    from normlab.report import evidence as E

    ev = load_evidence()
    ev["claims"][0]["measured"], ev["claims"][0]["ci"] = float("nan"), [float("-inf"), float("inf")]
    ev["replications"][0]["estimate"] = float("nan")
    other = next(c for c in ev["claims"] if c.get("exploratory_elsewhere"))
    other["exploratory_elsewhere"][0]["verdict"] = "held\x1b[2J\x07"
    monkeypatch.setattr(E, "load_evidence", lambda: ev)
    proc = normlab("advise", "tiny", "--no-write", "--json", cache=tmp_path / "c")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    assert got["evidence"]["corpus"] == ev["suite"]["corpus"]
    proc = normlab("advise", "tiny", "--no-write", cache=tmp_path / "c")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "held\\x1b[2J\\x07" in proc.stdout
