"""Quantization robustness and label-free scores in a real sweep report (issue 13 item 3-4): ``normlab compare``
on a tiny sweep, then ``normlab report SWEEP --quantize --label-free``. References: each run measured on its own
with ``normlab quantize`` and ``normlab eval --label-free`` (the per-run commands), averaged by hand, and scipy's
rank and linear correlations across the runs."""

from __future__ import annotations

import json
from statistics import mean

import pytest
import yaml

from tests.helpers import run_inproc

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

FAST = {"train.steps": 30, "train.eval_every": 15, "train.eval_batches": 2, "train.log_every": 5,
        "train.checkpoint_every": 15, "diag.every": 15,
        "data.source": "synthetic:markov?order=1&alphabet=16&length=60000&seed=3"}
VARIANTS = [{"name": "Pre-LN", "set": {"model.placement": "pre"}},
            {"name": "Pre-RMSNorm", "set": {"model.placement": "pre", "model.norm": "rmsnorm"}}]
TOKENS = "2048"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cache):
    d = tmp_path_factory.mktemp("qsweep")
    f = d / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "q", "base": "tiny", "set": FAST, "seeds": [0, 1], "variants": VARIANTS},
                                sort_keys=False))
    out = d / "out"
    r = run_inproc("compare", str(f), "--out", str(out), "--workers", "2", "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    rep = run_inproc("report", str(out), "--quantize", "--label-free", "--max-tokens", TOKENS, "--json", cache=cache)
    assert rep.returncode == 0, rep.stderr
    return out


def _md_column(md: str, label: str) -> dict[str, float]:
    """``{variant: value}`` of the column ``label`` of report.md's diagnostics table (one row per variant)."""
    lines = md.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("| variant |") and f" {label} |" in line)
    col = [c.strip() for c in lines[i].strip("|").split("|")].index(label)
    out = {}
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[col] not in ("", "n/a", "–"):
            out[cells[0]] = float(cells[col])
    return out


def test_report_quantization_rows_equal_per_run_quantize(sweep, tmp_path, cache):
    md = (sweep / "report.md").read_text()
    for label, rotate in (("W4 RTN Δbits/byte", "none"), ("W4 + Hadamard Δbits/byte", "hadamard")):
        row = _md_column(md, label)
        assert set(row) == {"Pre-LN", "Pre-RMSNorm"}, row
        for v in VARIANTS:
            slug = v["name"].lower()
            per_run = []
            for seed in (0, 1):
                q = run_inproc("quantize", str(sweep / "runs" / f"{slug}-s{seed}"), "--weights", "4", "--rotate",
                               rotate, "--max-tokens", TOKENS, "--out", str(tmp_path / f"{slug}-{seed}-{rotate}"),
                               "--json", cache=cache, check=True)
                per_run.append(json.loads(q.stdout)["bpb_increase"])
            assert row[v["name"]] == pytest.approx(mean(per_run), abs=1e-4), (label, v["name"], per_run)


def test_report_label_free_section_equals_per_run_eval_and_scipy(sweep, cache):
    from scipy import stats

    md = (sweep / "report.md").read_text()
    section = md[md.index("## Label-free metrics"):].split("\n## ")[0]
    mano, mnn, loss = [], [], []
    for v in VARIANTS:
        for seed in (0, 1):
            e = run_inproc("eval", str(sweep / "runs" / f"{v['name'].lower()}-s{seed}"), "--label-free",
                           "--max-tokens", TOKENS, "--json", cache=cache, check=True)
            m = json.loads(e.stdout)
            mano.append(m["label_free"]["mano"])
            mnn.append(m["label_free"]["matrix_nuclear_norm"])
            loss.append(m["loss"])
        row = next(line for line in section.splitlines() if line.startswith(f"| {v['name']} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) == pytest.approx(mean(mano[-2:]), abs=1e-5)
        assert float(cells[2]) == pytest.approx(mean(mnn[-2:]), abs=1e-4)
        assert float(cells[3]) == pytest.approx(mean(loss[-2:]), abs=1e-4) and cells[4] == "2"
    want = (f"Across 4 runs: MaNo vs loss Spearman {stats.spearmanr(mano, loss)[0]:+.3f}, Pearson "
            f"{stats.pearsonr(mano, loss)[0]:+.3f}; Matrix Nuclear-Norm vs loss Spearman "
            f"{stats.spearmanr(mnn, loss)[0]:+.3f}, Pearson {stats.pearsonr(mnn, loss)[0]:+.3f}.")
    assert want in section, section
    page = (sweep / "report.html").read_text()
    assert "Label-free metrics" in page and "W4 + Hadamard Δbits/byte" in page
