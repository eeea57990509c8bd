"""normlab.commands.eval: a run directory whose name holds an ANSI escape (a shared runs/ folder, a glob) is
echoed with the escape written out (safety.printable: ``\\x1b``), never as the raw byte that would drive the
terminal; markup in the name is shown as text."""

from __future__ import annotations

from tests.helpers import assert_name_echoed_printable


def test_the_run_name_is_echoed_without_raw_control_characters(run, tmp_path, cache):
    assert_name_echoed_printable("eval", run, tmp_path, cache, "--max-tokens", "256")


def test_train_and_eval_name_their_two_numbers_apart(tmp_path, cache):
    """train's number is a sample of the validation split (``sampled val bits/byte``, with the sample's size in
    summary.json: eval_batches x batch_size x context targets), eval's the whole split (``val bits/byte, whole
    split``, ``scope`` in its JSON); neither output uses the other's name."""
    import json

    import yaml

    from normlab.names import SAMPLED_VAL_BPB, split_bpb_label
    from tests.helpers import SHORT, run_inproc

    out = tmp_path / "r"
    t = run_inproc("train", "tiny", *SHORT, "--out", str(out), cache=cache, check=True)
    summary = json.loads((out / "summary.json").read_text())
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert summary["val_sample_tokens"] == (cfg["train"]["eval_batches"] * cfg["train"]["batch_size"]
                                            * cfg["model"]["context"])
    said = f"{SAMPLED_VAL_BPB} {summary['val_bpb']:.4f} on {summary['val_sample_tokens']:,} validation tokens"
    assert said in t.stdout
    assert split_bpb_label("val") not in t.stdout
    e = run_inproc("eval", str(out), cache=cache, check=True)
    assert split_bpb_label("val") == "val bits/byte, whole split" and "val bits/byte, whole split" in e.stdout
    assert SAMPLED_VAL_BPB not in e.stdout
    js = json.loads(run_inproc("eval", str(out), "--json", cache=cache, check=True).stdout)
    assert js["scope"] == "whole split" and js["tokens"] > summary["val_sample_tokens"]
    capped = run_inproc("eval", str(out), "--max-tokens", "256", cache=cache, check=True)
    assert "val bits/byte, first 256 tokens" in capped.stdout


def test_a_long_eval_shows_progress_on_a_terminal_and_json_stays_clean(run, tmp_path, cache):
    """On a terminal's stderr eval draws a progress bar of the tokens scored; stdout (``--json``) is one JSON
    object, untouched."""
    import json
    import os
    import pty
    import subprocess
    import sys

    from tests.helpers import cli_env

    master, slave = pty.openpty()
    env = {**cli_env(cache), "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "normlab", "eval", str(run), "--stride", "16", "--json"],
                            stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out, _ = proc.communicate(timeout=300)
    os.close(master)
    assert proc.returncode == 0, err.decode(errors="replace")
    js = json.loads(out)  # exactly one JSON object
    assert js["scope"] == "whole split"
    text = err.decode(errors="replace")
    assert "eval val" in text and "tokens" in text and f"/{js['tokens']}" in text.replace(",", ""), text[-2000:]
