"""The one-line error contract for operating-system errors (normlab.safety.os_error_line, guarded)."""

from __future__ import annotations

import errno

import pytest

from normlab.safety import guarded, one_line, os_error_line
import json
import os
from pathlib import Path
from tests.helpers import SHORT, assert_bad_input, run_inproc, tree


def test_an_oserror_without_strerror_keeps_its_message(capsys):
    """A dependency's ``OSError("...")`` (no errno) used to print 'error: OSError' and nothing else."""
    e = OSError("model.safetensors is missing from DIR\nsecond line")
    assert os_error_line(e) == "OSError: model.safetensors is missing from DIR"

    def run() -> int:
        raise e

    assert guarded(run) == 2
    err = capsys.readouterr().err
    assert err == "error: OSError: model.safetensors is missing from DIR\n"


@pytest.mark.parametrize("e,expected", [
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/y"), "/x/y: No such file or directory"),
    (OSError(), "OSError"),
])
def test_errno_errors_name_the_path(e, expected):
    assert os_error_line(e) == expected


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("err,fragment", [(errno.EROFS, "Read-only file system"), (errno.ENOSPC, "No space left"),
                                          (errno.EACCES, "Permission denied")])
def test_os_errors_are_one_line_naming_the_path(err, fragment, run_copy, monkeypatch, cache):
    """A read-only file system, a full disk, a permission error while writing eval_val.json: one line with the
    path, exit 2, the old file untouched and no temp file left."""
    real = os.replace

    def failing(src, dst, *a, **k):
        if str(dst).endswith("eval_val.json"):
            raise OSError(err, os.strerror(err), str(dst))
        return real(src, dst, *a, **k)

    before = tree(run_copy)
    monkeypatch.setattr(os, "replace", failing)
    proc = run_inproc("eval", str(run_copy), "--max-tokens", "256", cache=cache)
    assert_bad_input(proc, fragment, "eval_val.json")
    assert tree(run_copy) == before


READ_ONLY = [  # (command after RUN, the path whose write fails, where the output would go)
    (["train", "tiny", *SHORT, "--out", "NEW"], "config.yaml", "NEW"),
    (["convert", "RUN", "--to", "rmsnorm", "--max-tokens", "256", "--out", "NEW"], "NEW", "NEW"),
    (["extrapolate", "RUN", "--factors", "1", "--max-tokens", "256"], "extrapolation.json", None),
]


@pytest.mark.parametrize("argv,victim,new", READ_ONLY, ids=[r[0][0] for r in READ_ONLY])
def test_read_only_file_system_is_one_line_and_a_retry_works(argv, victim, new, run_copy, tmp_path, monkeypatch,
                                                             cache):
    """The issue's read-only file system for train / convert / extrapolate (eval: the row above): the write that
    fails raises EROFS; one line naming the path, exit 2, the run unchanged, no temporary files, and the same
    command succeeds once the file system is writable again."""
    real = os.replace
    out = tmp_path / "new"
    argv = [str(run_copy) if a == "RUN" else str(out) if a == "NEW" else a for a in argv]
    target = str(out) if victim == "NEW" else victim

    def failing(src, dst, *a, **k):
        if str(dst).endswith(target):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))
        return real(src, dst, *a, **k)

    before = tree(run_copy)
    monkeypatch.setattr(os, "replace", failing)
    assert_bad_input(run_inproc(*argv, cache=cache), "Read-only file system", victim if victim != "NEW" else "new")
    monkeypatch.setattr(os, "replace", real)
    assert tree(run_copy) == before
    assert not [p for p in tmp_path.rglob(".*") if p.name not in (".train.lock",)], "temporary files left"
    if new and out.exists():  # a failed train may leave its empty or config-less directory: it must not block a retry
        assert not (out / "config.yaml").exists()
    proc = run_inproc(*argv, cache=cache)
    assert proc.returncode == 0, proc.stderr


# The child parks itself at a chosen point of start-up (a wrapper writes a readiness marker there and waits), the
# test sends SIGINT only once that marker exists, so where the signal lands does not depend on the machine's load.
# The child starts with SIGINT at its default (as from a terminal; a background pytest would hand down SIG_IGN).
_CHILD = r'''
import signal, sys, time
from pathlib import Path
ready, phase, argv = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]

def park(until, n="1"):
    ready.write_text(n)  # the n-th readiness marker: the parent sends its n-th SIGINT now
    t = time.time() + 120  # never hang the suite
    while not until() and time.time() < t:
        time.sleep(0.01)

def handled():  # the first Ctrl-C reached normlab's handler (train()'s StopFlag, or a method of an object with one)
    h = signal.getsignal(signal.SIGINT)
    return bool(getattr(h, "stop", False) or getattr(getattr(h, "__self__", None), "stop", False))

if phase == "imports":  # park inside `import torch`, which the train command does inside the CLI's guard
    class Park:
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                sys.meta_path.remove(self)
                park(lambda: False)  # only the KeyboardInterrupt ends this
            return None
    sys.meta_path.insert(0, Park())
elif phase == "data":  # park in data preparation, after train() installed its handler
    import normlab.train.loop as loop
    real = loop.load_data
    def load_data(*a, **k):
        park(handled)
        return real(*a, **k)
    loop.load_data = load_data
elif phase == "loop":  # park in the training loop after the first metrics record: Ctrl-C twice there
    from normlab.train.tracking import Tracker
    real_log = Tracker.log
    def log(self, record):
        real_log(self, record)
        if not handled():
            park(handled, "1")
            park(lambda: False, "2")  # only the second Ctrl-C (KeyboardInterrupt) ends this
    Tracker.log = log
from normlab.cli import entry
sys.argv = ["normlab", *argv]
entry()
'''


def _parked_child(tmp_path: Path, phase: str, args: list[str], cache: Path, signals: int = 1):
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import cli_env

    ready = tmp_path / f"ready-{phase}"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(ready), phase, *args], env=cli_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for n in range(1, signals + 1):
        deadline = time.time() + 300
        while not (ready.exists() and ready.read_text() == str(n)) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert ready.exists() and ready.read_text() == str(n), \
            f"child never reached {phase} ({n}): {proc.communicate(timeout=60)[1][-2000:]}"
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def test_ctrl_c_during_imports_exits_130_and_writes_nothing(tmp_path, cache):
    out = tmp_path / "r"
    code, _, err = _parked_child(tmp_path, "imports", ["train", "tiny", *SHORT, "--out", str(out)], cache)
    assert code == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("interrupted (Ctrl-C)"), err
    assert not out.exists()


def test_ctrl_c_during_data_preparation_checkpoints_step_0_and_resumes_exactly(run, tmp_path, cache):
    """Documented: Ctrl-C once before the loop = checkpoint at step 0, summary status interrupted, exit 130; all
    files complete (no temporaries) and --resume ends with the weights of the uninterrupted run."""
    from tests.helpers import assert_same_weights, normlab

    out = tmp_path / "r"
    code, _, err = _parked_child(tmp_path, "data", ["train", "tiny", *SHORT, "--out", str(out)], cache)
    assert code == 130 and "Traceback" not in err, err
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["step"] == 0, s
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000000"]
    assert not [p for p in out.rglob(".*") if p.name != ".train.lock"], "temporary files left"
    r = normlab("train", "--resume", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    assert_same_weights(run, out)


def test_ctrl_c_twice_in_the_loop_closes_the_tensorboard_session(tmp_path, cache):
    """A second Ctrl-C stops at once: summary.json still written (interrupted), and the TensorBoard events end with
    the HParams session end (status unknown = interrupted), as when the loop ends by itself."""
    from normlab.train.tracking import read_hparams, read_scalars

    out = tmp_path / "r"
    code, _, err = _parked_child(tmp_path, "loop", ["train", "tiny", *SHORT, "--out", str(out)], cache, signals=2)
    assert code == 130 and "Traceback" not in err, err
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    assert read_hparams(out / "tb")["status"] == "STATUS_UNKNOWN"
    assert ("train/loss", 2) in {(t, s) for t, s, _ in read_scalars(out / "tb")}


def test_guarded_maps_bad_input_os_errors_and_closed_pipes(capsys):
    """``normlab.safety.guarded``: a NormlabError and an OSError are one line on stderr with exit 2 (the OSError's
    line names the path), a closed stdout pipe (an OSError too) exits 0 silently; ``debug`` re-raises the first two."""
    from normlab.errors import EXIT_BAD_INPUT, NormlabError
    from normlab.safety import guarded

    def raising(e):
        def run():
            raise e
        return run

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/x/y.json")
    assert guarded(raising(NormlabError("model.width must be >= 1"))) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "error: model.width must be >= 1\n"
    assert guarded(raising(full)) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == (f"error: /x/y.json: {os.strerror(errno.ENOSPC)} (free some space and re-run; "
                                       "train --resume RUN_DIR continues from the last checkpoint)\n")
    for debug in (False, True):
        assert guarded(raising(BrokenPipeError(errno.EPIPE, "Broken pipe")), debug=debug) == 0
        assert capsys.readouterr().err == ""
    for e in (NormlabError("x"), full):
        with pytest.raises(type(e)):
            guarded(raising(e), debug=True)


def test_printable_escapes_every_control_character():
    """C0 (ESC, newline, CR, tab, NUL), DEL and C1 (CSI 0x9b) become Python escapes; printable text, spaces and
    non-ASCII letters are kept; the result is one line whose escapes decode back to the input."""
    import codecs

    from normlab.safety import printable

    raw = "a\x1b[31m\nb\r\tc\x00\x7f\x9b é \u2028"
    shown = printable(raw)
    assert shown == "a\\x1b[31m\\nb\\r\\tc\\x00\\x7f\\x9b é \\u2028"
    assert shown.isprintable() and len(shown.splitlines()) == 1
    assert codecs.decode(shown.replace("é", "\\xe9"), "unicode_escape") == raw
    assert printable("model.width must be >= 1") == "model.width must be >= 1"


def test_a_set_value_with_an_escape_and_a_newline_is_one_escaped_error_line(cache):
    r = run_inproc("train", "tiny", "--set", "model.norm=\x1b[31m\nrms", "--out", "never-written", cache=cache)
    assert_bad_input(r, "unknown norm", "\\x1b[31m\\nrms")
    assert "\x1b" not in r.stderr and not Path("never-written").exists()


@pytest.mark.parametrize("name", ["run dir;rm -rf x", "a|b $(x) `y` 'q'", "new\nline\x1b[2J", "tab\there\\n"])
def test_shell_quote_gives_one_line_that_the_shell_reads_back(name):
    """shlex.split (POSIX sh) reads a printable name back; a name with a control character is bash ANSI-C
    quoted, and bash itself reads it back (the independent reference)."""
    import shlex
    import shutil
    import subprocess

    from normlab.safety import shell_quote

    q = shell_quote(name)
    assert len(q.splitlines()) == 1 and q.isprintable()
    if name.isprintable():
        assert shlex.split(f"normlab train {q}") == ["normlab", "train", name]
    if shutil.which("bash"):
        out = subprocess.run(["bash", "-c", f"printf '%s' {q}"], capture_output=True, text=True, check=True).stdout
        assert out == name


def test_a_full_disk_names_the_file_and_the_way_out(run_copy, monkeypatch, cache):
    """ENOSPC raised by a write that names no file (``write()``/``fsync`` on an open file) or as a library's own
    error (safetensors' StorageFull inside transformers' save_pretrained): the line names the file or directory
    being written and says what to do; a command without --resume does not suggest it."""
    real = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # no filename, as from a write on an open file

    monkeypatch.setattr(os, "fsync", full)
    r = run_inproc("eval", str(run_copy), "--max-tokens", "256", cache=cache)
    assert_bad_input(r, str(run_copy / "eval_val.json"), "No space left", "free some space", "re-run the command")
    assert "--resume" not in r.stderr
    monkeypatch.setattr(os, "fsync", real)

    pytest.importorskip("transformers")
    from safetensors import SafetensorError

    def storage_full(*a, **k):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')

    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", storage_full)
    out = run_copy.parent / "hf"
    r = run_inproc("export", str(run_copy), "--to", "hf", "--out", str(out), cache=cache)
    last = r.stderr.strip().splitlines()[-1]  # export names its stages first; the error is the one last line
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert last.startswith(f"error: {out}: No space left") and "free some space" in last and "--resume" not in last
    assert not out.exists()


def test_guarded_full_disk_hint_follows_the_command(capsys):
    from normlab.safety import guarded

    def full():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/x/ckpt")

    for command, fragment in (("train", "'normlab train --resume RUN_DIR' continues"),
                              ("compare", "re-run the same command: it keeps the finished runs"),
                              ("export", "re-run the command")):
        assert guarded(full, command=command) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: /x/ckpt: ") and fragment in err and len(err.splitlines()) == 1


def test_a_long_path_is_clipped_and_a_name_too_long_says_the_limit():
    import errno

    e = OSError(errno.ENAMETOOLONG, "File name too long", "d/" + "x" * 3000)
    assert os_error_line(e).endswith(
        "File name too long (the file system allows 255 bytes per name; give a shorter path)")
    line = one_line(os_error_line(e))
    assert line.startswith("d/xxx") and "(3003 characters)" in line and len(line) < 400


@pytest.mark.parametrize("setting, says", [
    ("model.norm={}", "unknown norm 'yyy"), ("data.source={}", "yyy"), ("model.placement={}", "model.placement"),
])
def test_every_echoed_blob_is_shortened_in_the_one_line(setting, says, tmp_path):
    """A 3,000-character value echoed by any check (the config's, the corpus loader's) reaches stderr shortened to
    its ends and length (``one_line``, applied by ``guarded`` to every message), still one line, exit 2."""
    from tests.helpers import assert_bad_input, run_inproc

    proc = run_inproc("train", "tiny", "--set", setting.format("y" * 3000), "--out", str(tmp_path / "r"),
                      cache=tmp_path / "c")
    assert_bad_input(proc, says, " characters)")
    assert len(proc.stderr) < 600
