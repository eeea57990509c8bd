"""``normlab remove-norm`` (normlab.surgery.remove_norm): a fine-tune stopped by SIGTERM / Ctrl-C is an
interruption (exit 130, the interrupt line, nothing published), not a divergence with "try a smaller --lr"
(issue 27 item 7)."""

from __future__ import annotations

import pytest

from tests.helpers import run_inproc
from tests.test_surgery import write_untrained

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("status,code,fragment", [
    ("interrupted", 130, "interrupted (Ctrl-C)"),
    ("diverged", 2, "diverged at step 3; try a smaller --lr"),
])
def test_an_interrupted_fine_tune_is_an_interruption(status, code, fragment, tmp_path, cache, monkeypatch):
    import normlab.surgery.remove_norm as remove_norm

    run = write_untrained(tmp_path / "src", cache)
    calls = []

    def stopped(cfg, run_dir, **kw):  # what train() returns when SIGTERM stops it (a checkpoint, status recorded)
        calls.append(run_dir)
        return {"status": status, "step": 3}

    monkeypatch.setattr(remove_norm, "train", stopped)  # the training loop remove_norm_run calls
    out = tmp_path / "out"
    p = run_inproc("remove-norm", str(run), "--out", str(out), "--steps", "5", "--max-tokens", "256", cache=cache)
    assert calls and p.returncode == code, p.stderr
    assert p.stderr.count("\n") == 1 and fragment in p.stderr and "Traceback" not in p.stderr
    if status == "interrupted":
        assert "smaller --lr" not in p.stderr
    assert not out.exists() and not list(tmp_path.glob(".out.*"))
