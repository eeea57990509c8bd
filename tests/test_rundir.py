"""normlab.run.rundir: a damaged run directory is one line naming what is wrong (and nothing is written); junk and
non-UTF-8 metrics lines are skipped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import assert_bad_input, run_inproc, tree

pytestmark = pytest.mark.usefixtures("one_thread")


def _damage(name: str):
    """Row helpers: each damages a copy of the finished run as the issue did."""
    def summary_list(d: Path) -> None:
        (d / "summary.json").write_text("[1]")

    def touch_diagnostics(d: Path) -> None:
        shutil.rmtree(d / "diagnostics", ignore_errors=True)
        (d / "diagnostics").write_text("")

    def mkdir_eval(d: Path) -> None:
        (d / "eval_val.json").unlink(missing_ok=True)
        (d / "eval_val.json").mkdir()

    def mkdir_reliability(d: Path) -> None:
        (d / "reliability.png").unlink(missing_ok=True)
        (d / "reliability.png").mkdir()

    def symlink_diagnostics(d: Path) -> None:
        outside = d.parent / "outside"
        outside.mkdir()
        shutil.rmtree(d / "diagnostics", ignore_errors=True)
        (d / "diagnostics").symlink_to(outside)

    return {"summary_list": summary_list, "touch_diagnostics": touch_diagnostics, "mkdir_eval": mkdir_eval,
            "mkdir_reliability": mkdir_reliability, "symlink_diagnostics": symlink_diagnostics}[name]


DAMAGED_RUN = [  # (damage, command after RUN, fragments, files that must not appear)
    ("summary_list", ["diagnose", "RUN"], ["summary", "must hold a JSON object", "summary.json"], ["diagnostics.json"]),
    ("summary_list", ["train", "--resume", "RUN"], ["summary", "must hold a JSON object"], []),
    ("touch_diagnostics", ["diagnose", "RUN"], ["diagnostics", "is a file, not a directory"], ["diagnostics.json"]),
    ("mkdir_eval", ["eval", "RUN", "--max-tokens", "256"], ["eval_val.json", "is a directory"], []),
    ("mkdir_reliability", ["calibrate", "RUN", "--max-tokens", "256"], ["reliability.png", "is a directory"],
     ["calibration.json"]),
    ("symlink_diagnostics", ["diagnose", "RUN"], ["refusing to write", "outside"], ["diagnostics.json"]),
]


@pytest.mark.parametrize("damage,argv,fragments,absent", DAMAGED_RUN,
                         ids=[f"{d}-{a[0]}" for d, a, _, _ in DAMAGED_RUN])
def test_damaged_run_dir_is_one_line(damage, argv, fragments, absent, run_copy, cache):
    _damage(damage)(run_copy)
    before = tree(run_copy)
    outside = tree(run_copy.parent / "outside")
    argv = [str(run_copy) if a == "RUN" else a for a in argv]
    assert_bad_input(run_inproc(*argv, cache=cache), *fragments)
    assert tree(run_copy) == before and tree(run_copy.parent / "outside") == outside  # nothing (half-)written
    for name in absent:
        assert not (run_copy / name).exists()


def test_junk_and_non_utf8_metrics_lines_are_skipped(run_copy, cache):
    from normlab.experiments.worker import read_metrics

    good = sorted({s for s, _, _ in read_metrics(run_copy / "metrics.jsonl")})
    assert 3 not in good and good[-1] == 8  # step 0 (loss at initialisation), then every log_every steps
    with open(run_copy / "metrics.jsonl", "ab") as f:
        f.write(b"junk\n\xff\xfe{\"step\": 3}\n[1, 2]\n")
    proc = run_inproc("diagnose", str(run_copy), "--sequences", "2", "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["training"]["records"] == 0  # diag.every=0: no diag records, none invented
    steps = sorted({s for s, _, _ in read_metrics(run_copy / "metrics.jsonl")})
    assert steps == good  # the good lines, nothing from the junk
