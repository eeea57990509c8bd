"""normlab.commands.stages: on a terminal, a command's stages print one line each above a rich progress bar with
the ETA once the first stage finished; piped, nothing (a refused input stays the one line on stderr). Checked on a
real pseudo-terminal (``pty``) and through a pipe, for the helper, ``normlab quantize`` and ``normlab claims``."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys

import pytest

from tests.helpers import cli_env

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
BAR = "━"  # rich's bar glyph


def on_a_pty(cmd: list[str], env: dict[str, str], timeout: float = 600) -> tuple[int, str, str]:
    """Run ``cmd`` with stderr on a new pseudo-terminal (stdout piped): ``(exit status, stdout, what the terminal
    got with the escape sequences removed)``."""
    master, slave = pty.openpty()
    env = {**env, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    env.pop("NO_COLOR", None)
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = p.stdout.read().decode()
    p.wait(timeout)
    return p.returncode, out, ANSI.sub("", b"".join(chunks).decode(errors="replace"))


def stage_lines(what: str, tty: str) -> list[str]:
    """The stages named by ``what [i/N] stage (elapsed)`` lines, in order (the bar's redraws share their lines)."""
    return [m[1] for m in re.finditer(rf"{what} \[\d+/\d+\] (.+?) \(\d+\.\ds\)", tty)]


STAGES = ("import time\nfrom normlab.commands.stages import StageProgress\n"
          "with StageProgress('export', 3) as say:\n"
          "    say('loading the run'); time.sleep(0.4); say('writing'); time.sleep(0.6); say('checking')\n")


def test_the_bar_and_its_eta_on_a_terminal_nothing_when_piped(tmp_path):
    env = cli_env(tmp_path)
    rc, _, tty = on_a_pty([sys.executable, "-c", STAGES], env)
    assert rc == 0, tty
    assert stage_lines("export", tty) == ["loading the run", "writing", "checking"], tty
    assert "export [1/3] loading the run" in tty and "export [3/3] checking" in tty
    assert BAR in tty and "ETA after the first stage finishes" in tty, tty
    assert re.search(r"ETA \d+s", tty), tty  # once a stage finished: the remaining ones at their mean time
    piped = subprocess.run([sys.executable, "-c", STAGES], env=env, capture_output=True, text=True, check=True)
    assert piped.stderr == "" and piped.stdout == ""


def test_eta_is_the_remaining_stages_at_the_mean_time_of_the_finished_ones(monkeypatch):
    """By hand: 2 of 5 stages finished in 30 s leave 3 at 15 s each."""
    from normlab.commands import stages

    clock = iter([100.0, 130.0, 100.0])
    monkeypatch.setattr(stages.time, "monotonic", lambda: next(clock))
    p = stages.StageProgress("quantize", 5)
    assert p.eta_text(2) == "ETA 45s" and p.eta_text(0) == "ETA after the first stage finishes"


def test_lines_without_a_bar_where_rich_cannot_draw(monkeypatch):
    """stderr claims a terminal but is not one rich can draw on (a test's capture): the stage lines alone, whole
    (not wrapped at 80 columns), no bar."""
    from normlab.commands import stages

    err = io.StringIO()
    monkeypatch.setattr(stages, "stages_visible", lambda: True)
    monkeypatch.setattr(sys, "stderr", err)
    long = "x" * 150
    with stages.StageProgress("export", 2) as say:
        say("loading the run")
        say(long)
    lines = err.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("export [1/2] loading the run (")
    assert lines[1].startswith(f"export [2/2] {long} (") and BAR not in err.getvalue()


def test_quantize_on_a_terminal_and_piped(run, tmp_path, cache):
    env = cli_env(cache)
    cmd = [sys.executable, "-m", "normlab", "quantize", str(run), "--weights", "8", "--max-tokens", "128"]
    rc, out, tty = on_a_pty(cmd + ["--out", str(tmp_path / "q1")], env)
    assert rc == 0, tty
    stages = ["scoring the float model", "quantizing the weights", "scoring the quantized model"]
    assert stage_lines("quantize", tty) == stages, tty
    assert BAR in tty and "bits/byte" in out
    piped = subprocess.run(cmd + ["--out", str(tmp_path / "q2")], env=env, capture_output=True, text=True)
    assert piped.returncode == 0 and "quantize [" not in piped.stderr and BAR not in piped.stderr
    bad = subprocess.run(cmd[:-4] + ["--weights", "4", "--grid", "higgs", "--group", "48", "--out",
                                     str(tmp_path / "q3")], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.slow
def test_claims_measuring_bar_on_a_terminal(tmp_path):
    """``normlab claims``: after the training sweep (its own bar), one line per claim measured above a bar of the
    claims; piped, none of it."""
    env = cli_env(tmp_path / "cache")
    cmd = [sys.executable, "-m", "normlab", "claims", "--budget", "tiny", "--only", "exact-conversion,powernorm-lm",
           "--out", str(tmp_path / "c")]
    rc, _, tty = on_a_pty(cmd, env)
    assert rc == 0, tty[-3000:]
    assert stage_lines("claims", tty) == ["exact-conversion", "powernorm-lm"], tty[-3000:]
    assert BAR in tty
    piped = subprocess.run(cmd, env=env, capture_output=True, text=True)  # all reused: measuring only
    assert piped.returncode == 0 and "claims [" not in piped.stderr and BAR not in piped.stderr
