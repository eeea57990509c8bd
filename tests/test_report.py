"""The sweep report: statistics against independent references, the ranking table against the stored numbers,
optional sections, self-containment, and a headless-Chromium render."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from scipy.stats import ttest_ind

from normlab.experiments.store import Store
from normlab.experiments.worker import record
from normlab.stats.intervals import mean_ci, t_cdf, t_ppf, welch
from tests.helpers import run_inproc as normlab

# two-sided 95% Student-t quantiles t_{0.975, df} (standard tables)
T975 = {1: 12.7062047, 2: 4.3026527, 3: 3.1824463, 4: 2.7764451, 5: 2.5705818, 10: 2.2281389, 30: 2.0422725}


def _t_pdf(x: float, df: float) -> float:
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    return c * (1 + x * x / df) ** (-(df + 1) / 2)


def _t_cdf_numeric(t: float, df: float, n: int = 20000) -> float:
    """Independent reference: 0.5 + Simpson's rule of the density over [0, |t|]."""
    h = abs(t) / n
    s = _t_pdf(0, df) + _t_pdf(abs(t), df) + sum((4 if i % 2 else 2) * _t_pdf(i * h, df) for i in range(1, n))
    half = s * h / 3
    return 0.5 + half if t >= 0 else 0.5 - half


def test_t_quantiles_match_tables():
    for df, q in T975.items():
        assert t_ppf(0.975, df) == pytest.approx(q, abs=1e-6)
    assert t_ppf(0.025, 4) == pytest.approx(-T975[4], abs=1e-6) and t_ppf(0.5, 3) == 0.0


@pytest.mark.parametrize("t, df", [(0.3, 1), (1.7, 2.5), (-2.2, 3.8), (4.0, 10), (0.9, 57.3)])
def test_t_cdf_matches_numeric_integration(t, df):
    assert t_cdf(t, df) == pytest.approx(_t_cdf_numeric(t, df), abs=1e-7)


@pytest.mark.parametrize("a, b", [
    ([3.0, 3.2], [3.5, 3.7]),
    ([3.1, 3.15, 3.3], [3.12, 3.4, 3.5, 3.45]),
    ([1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]),
    ([5.1, 5.2], [5.1, 5.3]),
    ([2.0, 2.0], [1.0, 1.5, 1.7]),  # one side without spread
    ([3.0, 3.0001, 3.0002], [4.0, 4.0001, 4.0003]),  # p ~ 7e-14: no cancellation in 1 - cdf
])
@pytest.mark.filterwarnings("ignore:Precision loss occurred in moment calculation:RuntimeWarning")  # scipy, constant a
def test_welch_matches_scipy_ttest_ind(a, b):
    ref = ttest_ind(a, b, equal_var=False)
    w = welch(a, b)
    assert w.t == pytest.approx(ref.statistic, rel=1e-9) and w.df == pytest.approx(ref.df, rel=1e-9)
    assert w.p == pytest.approx(ref.pvalue, rel=1e-9, abs=0.0)


def test_welch_against_hand_computation():
    a, b = [1.0, 2.0, 3.0], [4.0, 5.0, 6.5]
    ma, mb = sum(a) / 3, sum(b) / 3
    va = sum((x - ma) ** 2 for x in a) / 2 / 3
    vb = sum((x - mb) ** 2 for x in b) / 2 / 3
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    w = welch(a, b)
    assert w.t == pytest.approx(t) and w.df == pytest.approx(df)
    assert w.p == pytest.approx(2 * (1 - _t_cdf_numeric(abs(t), df)), abs=1e-6)
    assert welch([1.0], b) is None and welch([1.0, 1.0], [2.0, 2.0]) is None
    ci = mean_ci([2.0, 2.2])
    assert ci.mean == pytest.approx(2.1) and ci.half == pytest.approx(T975[1] * math.sqrt(0.02) / math.sqrt(2))
    assert mean_ci([3.0]).half is None


# -- a stored sweep with known numbers ---------------------------------------------------------------------------
FINALS = {"Alpha": [2.0012, 2.0107, 2.0231], "Beta": [2.5003, 2.5121, 2.5208], "Gamma": [2.0051, 2.1093, None]}
FLOOR = 1.25


def _diagnostics(depth: int, scale: float) -> dict:
    return {
        "variance": {"var": [scale * (1.5**b) for b in range(depth + 1)], "rms": [1.0] * (depth + 1),
                     "log_var_slope": 0.4},
        "massive": {"blocks": [{"block": b, "ratio": 10.0 * scale * (b + 1)} for b in range(depth)],
                    "max_ratio": 40.0},
        "sinks": {"sink_rate": 0.25, "sink_rate_per_layer": [0.1 * b for b in range(depth)],
                  "first_token_importance_mean": 0.2},
        "layer_effectiveness": {"blocks": [{"block": b, "angular_distance": 0.1 * (b + 1), "skip_loss_increase": 0.01}
                                           for b in range(depth)]},
    }


def make_sweep(d: Path, *, extras: bool = True, one_eval: bool = False) -> Path:
    """A results store + run dirs with fixed finals: Alpha and Gamma close, Beta far; Gamma seed 2 diverged.
    ``one_eval``: each run has one validation point (its final), as a run with ``eval_every == steps``."""
    store = Store(d / "results.sqlite")
    store.create("fake", "f" * 16)
    runs = []
    for v, finals in FINALS.items():
        for seed in range(3):
            runs.append({"run_id": f"{v.lower()}-s{seed}", "position": len(runs), "variant": v, "seed": seed,
                         "config_hash": f"{v}{seed}", "axes": {"variant": v}, "overrides": {"model.norm": v.lower()},
                         "config": {"seed": seed, "data": {"source": "synthetic:markov?order=2", "tokenizer": "bytes"},
                                    "model": {"width": 64, "depth": 4, "heads": 2, "context": 64, "activation": "gelu",
                                              "positions": "rope"},
                                    "train": {"steps": 20, "batch_size": 8, "grad_accum": 1, "lr": 0.003,
                                              "warmup_steps": 2, "eval_every": 10, "eval_batches": 2}}})
    store.register(runs)
    for r in runs:
        final = FINALS[r["variant"]][r["seed"]]
        run_dir = d / "runs" / r["run_id"]
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(f"seed: {r['seed']}\nmodel:\n  norm: {r['variant'].lower()}\n")
        recs = [{"step": s, "loss": 3.0 - s / 20, "lr": 1e-3, "grad_norm": 0.5} for s in (5, 10, 15, 20)]
        if final is not None:
            recs[1]["val_bpb"], recs[3]["val_bpb"] = final + 0.3, final
            if one_eval:
                del recs[1]["val_bpb"]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
        summary = {"status": "completed" if final is not None else "diverged", "step": 20 if final else 7, "steps": 20,
                   "val_bpb": final, "best_val_bpb": final, "entropy_floor_bpb": FLOOR,
                   "tokens_per_s": 1000.0 * (1 + r["seed"]), "elapsed_s": 10.0, "params": 1234}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        if extras and r["variant"] != "Beta":
            (run_dir / "diagnostics.json").write_text(
                json.dumps(_diagnostics(4, 1.0 if r["variant"] == "Alpha" else 2.0))
            )
            # bits/byte under its old name (before normlab.names): the report still reads it
            (run_dir / "extrapolation.json").write_text(json.dumps({"results": [
                {"factor": f, "context": 64 * f, "loss": 2.0, "bits_per_byte": 2.0 + 0.1 * f} for f in (1, 2, 4)]}))
            (run_dir / "calibration.json").write_text(json.dumps({"ece_before": 0.05, "ece_after": 0.01,
                                                                  "temperature": 1.2}))
        if extras and r["run_id"] == "beta-s0":
            (run_dir / "diagnostics.json").write_text("{not json")  # unreadable: skipped, not fatal
        record(store, d, r["run_id"], summary, peak_mem_mb=100.0)
    return d


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = make_sweep(tmp_path_factory.mktemp("fake"))
    proc = normlab("report", str(d), "--json", cache=d / "cache")
    assert proc.returncode == 0, proc.stderr
    return d, json.loads(proc.stdout)


def _reference_row(values: list[float]) -> tuple[float, float]:
    n = len(values)
    m = sum(values) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in values) / (n - 1))
    return m, T975[n - 1] * sd / math.sqrt(n)


def test_ranking_table_matches_stored_numbers(report):
    d, js = report
    stored = {}
    for r in Store(d / "results.sqlite").runs():
        if r["status"] == "completed":
            stored.setdefault(r["variant"], []).append(r["val_bpb"])
    expected = {v: _reference_row(xs) for v, xs in stored.items()}
    order = sorted(expected, key=lambda v: expected[v][0])
    assert [row["variant"] for row in js["ranking"]] == order == ["Alpha", "Gamma", "Beta"]
    for row in js["ranking"]:
        m, h = expected[row["variant"]]
        assert row["val_bpb_mean"] == pytest.approx(m, abs=1e-12) and row["val_bpb_ci95"] == pytest.approx(h, rel=1e-7)
        assert row["gap_to_floor"] == pytest.approx(m - FLOOR)
    gamma = next(r for r in js["ranking"] if r["variant"] == "Gamma")
    assert gamma["completed"] == 2 and gamma["seeds"] == 3 and gamma["diverged"] == 1
    # the Markdown table shows the same numbers
    md = (d / "report.md").read_text()
    rows = [line for line in md.splitlines() if re.match(r"\| \d \| ", line)]
    assert len(rows) == 3
    for line, v in zip(rows, order):
        cells = [c.strip() for c in line.strip("|").split("|")]
        m, h = expected[v]
        assert cells[1] == v and cells[2] == f"{m:.4f} ± {h:.4f}" and cells[4] == f"{m - FLOOR:.4f}"
    assert "| 2 | Gamma |" in md and "| 2/3 | 1 |" in md


def test_summary_states_what_the_numbers_show(report):
    _, js = report
    text = "\n".join(js["summary"])
    assert "Lowest mean final validation bits/byte: Alpha" in text
    # the best variant is chosen by the data: its differences are exploratory estimates, never verdicts
    assert re.search(r"Differences from Alpha, exploratory.*Gamma \+0\.0455 ± .*Beta \+0\.4994 ± ", text)
    assert not re.search(r"\b(lower|higher|worse|better)\b|beyond noise|within noise", text, re.IGNORECASE)
    assert "Gamma diverged in 1 of 3 seeds (at step 7)" in text
    assert f"entropy floor is {FLOOR:.4f}" in text


def test_report_sections_and_self_contained_html(report):
    d, _ = report
    html = (d / "report.html").read_text()
    for heading in ("Summary", "Ranking", "Validation curves", "Diagnostics", "Length extrapolation", "Calibration",
                    "Setup", "Reproduce"):
        assert f"<h2>{heading}</h2>" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert "<link" not in html and "<script" not in html and "@import" not in html and "url(" not in html
    imgs = re.findall(r"<img [^>]*src='([^']*)'", html)
    pngs = sorted(p.name for p in d.glob("report_*.png"))
    assert len(imgs) == len(pngs) >= 8 and all(s.startswith("data:image/png;base64,") for s in imgs)
    md = (d / "report.md").read_text()
    assert sorted(re.findall(r"\]\((report_[^)]+\.png)\)", md)) == pngs
    for r in Store(d / "results.sqlite").runs():  # a command to reproduce every run
        assert f"normlab train {d / 'runs' / r['run_id'] / 'config.yaml'}" in html
    assert f"normlab compare {d / 'sweep.yaml'} --out {d}" in md
    assert "report_diag_variance.png" in pngs and "report_diag_sink.png" in pngs


def test_optional_sections_absent_without_data(tmp_path):
    d = make_sweep(tmp_path, extras=False)
    assert normlab("report", str(d), cache=tmp_path / "cache").returncode == 0
    html = (d / "report.html").read_text()
    for heading in ("Diagnostics", "Length extrapolation", "Calibration"):
        assert f"<h2>{heading}</h2>" not in html
    assert sorted(p.name for p in d.glob("report_*.png")) == ["report_curves.png", "report_ranking.png"]


def test_report_bad_input(tmp_path):
    for args, frag in ((["report", str(tmp_path / "none")], "does not exist"),
                       (["report", str(tmp_path)], "no results.sqlite")):
        proc = normlab(*args, cache=tmp_path / "cache")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and frag in proc.stderr, proc.stderr


def test_report_refuses_a_baseline_that_is_not_a_variant(tmp_path):
    """--baseline on a sweep directory names one of its variants; a misspelt one is bad input (it used to fall back to
    the first variant silently, comparing against a baseline the user did not ask for), and nothing is written."""
    d = make_sweep(tmp_path, extras=False)
    proc = normlab("report", str(d), "--baseline", "Alhpa", cache=tmp_path / "cache")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "'Alhpa' is not a variant" in proc.stderr and "Alpha, Beta, Gamma" in proc.stderr, proc.stderr
    assert not (d / "report.html").exists()
    proc = normlab("report", str(d), "--baseline", "Beta", "--json", cache=tmp_path / "cache")
    assert proc.returncode == 0 and json.loads(proc.stdout)["lr"]["baseline"] == "Beta", proc.stderr


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (make test installs Debian's chromium)")
def test_html_renders_in_headless_chromium(report, tmp_path):
    from matplotlib.image import imread

    d, _ = report
    shot = tmp_path / "shot.png"
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,2000",
           (d / "report.html").resolve().as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120, check=False)
    assert shot.is_file(), "chromium wrote no screenshot"
    img = imread(str(shot))
    assert img.shape[:2] == (2000, 1200)
    rgb = img[..., :3]
    non_white = (rgb < 0.9).any(axis=-1).mean()
    assert non_white > 0.03 and rgb.std() > 0.05, (non_white, rgb.std())
    colored = ((rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.2).mean()  # the plots' coloured lines and bands
    assert colored > 0.002, colored
    # every figure, as the browser decoded it: natural size > 0 and pixels that are not all background
    figures = _browser_figures(d / "report.html", tmp_path)
    html = (d / "report.html").read_text()
    assert len(figures) == html.count("<img") == html.count("data:image/png;base64,") >= 4, figures
    for f in figures:
        assert f["w"] > 100 and f["h"] > 100, f
        assert f["ink"] > 0.01 and f["color"] > 0.0005, f  # axes and text, and at least one coloured mark
    # this report too (diagnostics, curves, tables) fits a 1280-px window (tests/report/test_document.py)
    from tests.report.test_document import browser_layout

    layout = browser_layout(d / "report.html", tmp_path, 1280)
    assert layout["scrollWidth"] <= layout["innerWidth"] == 1280, layout


def test_curves_of_runs_with_one_evaluation_show_a_point(tmp_path, monkeypatch):
    """One validation point per run: the validation panel is a dot plot, one labelled row per variant with its
    seeds' values and their mean as visible markers inside the axis limits, rather than an empty frame or a column
    of dots at one step (normlab.report.plots.MIN_CURVE_EVALS)."""
    import normlab.report.plots as plots

    figs = []
    real_png = plots.png
    monkeypatch.setattr(plots, "png", lambda fig: figs.append(fig) or real_png(fig))
    (tmp_path / "one").mkdir()
    d = make_sweep(tmp_path / "one", extras=False, one_eval=True)
    assert normlab("report", str(d), cache=tmp_path / "cache").returncode == 0
    ax_v = next(f for f in figs if f.axes and f.axes[0].get_title().startswith("validation bits/byte")).axes[0]
    labels = [t.get_text() for t in ax_v.get_yticklabels()]
    assert sorted(labels) == ["Alpha", "Beta", "Gamma"], labels  # one labelled row per variant
    (x0, x1), (y0, y1) = ax_v.get_xlim(), ax_v.get_ylim()
    pts = [p for c in ax_v.collections for p in c.get_offsets()]
    assert len(pts) >= 3 + 8  # a mean per variant and each finished seed (Gamma's seed 2 diverged)
    for x, y in pts:
        assert x0 < x < x1 and y0 < y < y1


FIGURE_PROBE = """<script>
window.addEventListener('load', () => {
  const out = [...document.images].map(im => {
    const c = document.createElement('canvas'); c.width = im.naturalWidth; c.height = im.naturalHeight;
    const g = c.getContext('2d'); g.drawImage(im, 0, 0);
    const px = c.width && c.height ? g.getImageData(0, 0, c.width, c.height).data : [];
    let ink = 0, color = 0;
    for (let i = 0; i < px.length; i += 4) {
      const mx = Math.max(px[i], px[i + 1], px[i + 2]), mn = Math.min(px[i], px[i + 1], px[i + 2]);
      if (mx < 230) ink++;
      if (mx - mn > 50) color++;
    }
    const n = Math.max(1, px.length / 4);
    return {alt: im.alt.slice(0, 60), w: im.naturalWidth, h: im.naturalHeight, ink: ink / n, color: color / n};
  });
  const pre = document.createElement('pre'); pre.id = 'figure-probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _browser_figures(report_html: Path, tmp_path: Path) -> list[dict]:
    """Each ``<img>`` of the report as headless Chromium decodes it: natural width and height, the share of
    non-background pixels (``ink``) and of coloured ones (``color``), read back from a canvas by a probe script
    added to a copy of the page (the report itself stays script-free)."""
    page = tmp_path / "probe.html"
    page.write_text(report_html.read_text().replace("</body>", FIGURE_PROBE + "</body>"))
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'probe-profile'}", "--virtual-time-budget=10000", "--dump-dom",
           page.resolve().as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False).stdout
    m = re.search(r"<pre id=\"figure-probe\">(.*?)</pre>", dom, re.S)
    assert m, "the probe found no figures (chromium printed no DOM)"
    import html as html_lib

    return json.loads(html_lib.unescape(m.group(1)))


def test_report_skips_fifo_artifacts_instead_of_hanging(tmp_path, cache):
    """Every file the report reads from a sweep (sweep.yaml, each run's summary / diagnostics / extrapolation /
    calibration / config.yaml) goes through ``normlab.io``'s regular-file check: FIFOs in their place are skipped
    like missing files (the ranking comes from the store), and the command returns."""
    import os

    from tests.helpers import HOSTILE, make_sweep as make_store_sweep, normlab as normlab_process

    s = make_store_sweep(tmp_path / "s", HOSTILE[:3])
    run = s / "runs" / "r0"
    run.mkdir(parents=True)
    for name in ("summary.json", "diagnostics.json", "extrapolation.json", "calibration.json", "config.yaml"):
        os.mkfifo(run / name)
    os.mkfifo(s / "sweep.yaml")
    try:
        r = normlab_process("report", str(s), "--json", cache=cache, timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError("normlab report hung on a FIFO in a sweep directory") from None
    assert r.returncode == 0, r.stderr
    ranking = {row["variant"]: row for row in json.loads(r.stdout)["ranking"]}
    assert ranking[HOSTILE[0][0]]["val_bpb_mean"] == pytest.approx((HOSTILE[0][3] + HOSTILE[1][3]) / 2)


def test_repro_commands_quote_run_paths_with_shell_characters(run, tmp_path, cache):
    """A run directory named with a space and ``;``: every command in report.md's Reproduce section reads back
    through ``shlex.split`` (POSIX shell words) to the report's own paths, so copying it cannot run a second
    command."""
    import shlex

    src = tmp_path / "a b;echo pwned"
    shutil.copytree(run, src)
    out = tmp_path / "rep out"
    r = normlab("report", str(src), "--out", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    md = (out / "report.md").read_text()
    whole = next(ln for ln in md.splitlines() if ln.startswith("normlab report "))
    assert shlex.split(whole) == ["normlab", "report", str(src), "--out", str(out)]
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and "normlab train" in ln]
    assert len(rows) == 1
    code = re.search(r"`(normlab train [^`]*)`", rows[0]).group(1).replace("\\|", "|")
    argv = shlex.split(code)
    assert argv[:2] == ["normlab", "train"] and argv[2] == str(src / "config.yaml") and argv[3] == "--out"
    html = (out / "report.html").read_text()
    assert html.count("normlab train &#x27;") >= 1 or html.count("normlab train '") >= 1
