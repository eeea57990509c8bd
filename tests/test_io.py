"""Files and directories normlab writes honour the umask exactly as ``open()`` / ``mkdir()`` do (issue 29 item 2):
the reference is the mode of a file and a directory created the ordinary way under the same umask.

normlab.io.publish_dir / check_new_dir: the one helper every command that writes a whole output directory
(convert, export, import, quantize, remove-norm) goes through. Checked against the file system itself."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from normlab.errors import NormlabError
from normlab.io import atomic_path, check_new_dir, current_umask, publish_dir, write_json
from normlab.locks import exclusive_lock
from tests.helpers import SHORT, assert_bad_input, cli_env, run_inproc

def _reference_modes(where: Path) -> tuple[int, int]:
    """(file mode, directory mode) that plain ``open(..., "w")`` and ``mkdir`` give under the current umask."""
    f, d = where / "ref-file", where / "ref-dir"
    with open(f, "w") as h:
        h.write("x")
    d.mkdir()
    modes = stat.S_IMODE(f.stat().st_mode), stat.S_IMODE(d.stat().st_mode)
    f.unlink()
    d.rmdir()
    return modes


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o027])
def test_atomic_writes_and_published_dirs_get_open_modes(tmp_path, mask):
    old = os.umask(mask)
    try:
        assert current_umask() == mask
        fmode, dmode = _reference_modes(tmp_path)
        write_json(tmp_path / "a.json", {"x": 1})
        with atomic_path(tmp_path / "b.bin") as tmp:
            tmp.write_bytes(b"\0")
        with publish_dir(tmp_path / "out") as d:
            (d / "inner.txt").write_text("y")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == fmode
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == fmode
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == dmode
    assert stat.S_IMODE((tmp_path / "out" / "inner.txt").stat().st_mode) == fmode


def _modes_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def _check_tree(root: Path, fmode: int, dmode: int) -> None:
    bad = {k: oct(m) for k, m in _modes_under(root).items()
           if m != (dmode if (root / k).is_dir() else fmode)}
    assert not bad, f"modes differ from open()/mkdir() ({oct(fmode)}/{oct(dmode)}): {bad}"


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_a_run_and_its_hf_export_honour_the_umask(tmp_path, cache, mask):
    env = cli_env(cache)
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "normlab", "train", "tiny", "--set", "train.steps=2", "--set",
                    "train.eval_every=2", "--set", "train.checkpoint_every=2", "--set", "model.context=16",
                    "--out", str(run)], env=env, umask=mask, check=True, capture_output=True)
    old = os.umask(mask)
    try:
        fmode, dmode = _reference_modes(tmp_path)
    finally:
        os.umask(old)
    _check_tree(run, fmode, dmode)
    if mask == 0o022:  # the export's weights too (transformers writes config.json itself)
        pytest.importorskip("transformers")
        exp = tmp_path / "hf"
        subprocess.run([sys.executable, "-m", "normlab", "export", str(run), "--to", "hf", "--out", str(exp)],
                       env=env, umask=mask, check=True, capture_output=True)
        _check_tree(exp, fmode, dmode)


pytestmark = pytest.mark.usefixtures("one_thread")


ALIAS_BOMB = """name: bomb
base: tiny
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
description: [*c, *c, *c, *c, *c, *c, *c, *c, *c]
"""


def test_yaml_alias_bomb_is_refused(tmp_path, cache):
    sweep = tmp_path / "bomb.yaml"
    sweep.write_text(ALIAS_BOMB)
    assert_bad_input(run_inproc("compare", str(sweep), "--out", str(tmp_path / "s"), cache=cache),
                     "YAML aliases", str(sweep))
    assert not (tmp_path / "s").exists()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("seed: 0\nmodel: &m {width: 64}\ndata: *m\n")
    assert_bad_input(run_inproc("train", str(cfg), "--out", str(tmp_path / "o"), cache=cache), "YAML aliases", "cfg")


def test_out_an_existing_file(tmp_path, cache):
    f = tmp_path / "taken"
    f.write_text("keep me")
    assert_bad_input(run_inproc("train", "tiny", *SHORT, "--out", str(f), cache=cache), "is a file", str(f))
    assert f.read_text() == "keep me"


def test_strict_json_everywhere(tmp_path, cache):
    """A run that diverges on a NaN loss: summary.json, metrics.jsonl and --json hold null, never bare NaN."""
    from normlab.io import dumps, strict

    assert strict({"a": float("nan"), "b": [float("inf"), 1.0]}) == {"a": None, "b": [None, 1.0]}
    assert dumps({"x": float("-inf")}) == '{"x": null}'
    out = tmp_path / "d"
    proc = run_inproc("train", "tiny", *SHORT, "--set", "train.lr=1e30", "--set", "train.grad_clip=0",
                      "--set", "train.warmup_steps=0", "--out", str(out), "--json", cache=cache)
    assert proc.returncode == 3, proc.stderr

    def bad(c: str):
        raise AssertionError(f"bare {c} in JSON")

    s = json.loads(proc.stdout, parse_constant=bad)
    assert s["status"] == "diverged"
    json.loads((out / "summary.json").read_text(), parse_constant=bad)
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=bad)


def test_stale_temp_dirs_are_cleaned_and_resume_is_locked(run_copy, cache):
    stale = run_copy / "checkpoints" / ".step_00000012.abcd1234"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    tmpfile = run_copy / ".summary.json.x1y2.tmp"
    tmpfile.write_text("{")
    (run_copy / "summary.json").unlink()  # so --resume really opens the run
    with exclusive_lock(run_copy / ".train.lock", "test"):
        assert_bad_input(run_inproc("train", "--resume", str(run_copy), cache=cache), "in use by another normlab",
                         str(run_copy))
    assert stale.exists()  # a refused resume touches nothing
    proc = run_inproc("train", "--resume", str(run_copy), "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and not tmpfile.exists()


def test_convert_cleans_its_stale_temp_dir(run, tmp_path, cache):
    out = tmp_path / "conv"
    stale = tmp_path / ".conv.k9k9k9k9"
    stale.mkdir()
    (stale / "config.yaml").write_text("half")
    proc = run_inproc("convert", str(run), "--to", "rmsnorm", "--out", str(out), "--max-tokens", "256", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and (out / "model.safetensors").is_file()


# ---------------------------------------------------------------- publish_dir / check_new_dir
def test_publish_dir_appears_only_complete(tmp_path):
    out = tmp_path / "sub" / "out"
    with publish_dir(out) as tmp:
        (tmp / "a.txt").write_text("x")
        assert not out.exists() and tmp.parent == out.parent and tmp.name.startswith(".out.")
    assert (out / "a.txt").read_text() == "x"
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_publish_dir_error_leaves_nothing_and_replaces_an_empty_dir(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with publish_dir(out) as tmp:
            (tmp / "half.bin").write_bytes(b"\0" * 10)
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    out.mkdir()  # an empty --out the user made is fine and is replaced
    with publish_dir(out) as tmp:
        (tmp / "b").write_text("y")
    assert [p.name for p in out.iterdir()] == ["b"]


def test_publish_dir_removes_stale_temps_of_its_name_only(tmp_path):
    stale = tmp_path / ".out.abcd1234"  # what a kill -9 leaves (mkdtemp's 8 random characters)
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x")
    other = tmp_path / ".other.abcd1234"
    other.mkdir()
    with publish_dir(tmp_path / "out") as tmp:
        (tmp / "c").write_text("z")
    assert not stale.exists() and other.exists()


def test_check_new_dir_refuses_files_and_non_empty_dirs(tmp_path):
    f = tmp_path / "f"
    f.write_text("keep")
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").write_text("keep")
    for p in (f, d):
        with pytest.raises(NormlabError, match="already exists and is not empty"):
            check_new_dir(p)
    assert f.read_text() == "keep" and (d / "x").read_text() == "keep"
    assert check_new_dir(tmp_path / "new") == tmp_path / "new" and not (tmp_path / "new").exists()



def test_check_new_dir_refuses_a_symlink_before_any_work(tmp_path):
    """A link at ``--out`` (dangling, or to an empty directory) passed the check and failed only at publish_dir's
    final rename ('Not a directory'), after the conversion or fine-tune had run; now it is refused up front and the
    link and its target stay as they were."""
    empty = tmp_path / "empty"
    empty.mkdir()
    dangling, to_empty = tmp_path / "dangling", tmp_path / "to_empty"
    dangling.symlink_to(tmp_path / "missing")
    to_empty.symlink_to(empty)
    for link in (dangling, to_empty):
        with pytest.raises(NormlabError) as e:
            check_new_dir(link, "--out")
        assert str(e.value).startswith(f"--out {link} is a symbolic link;") and "\n" not in str(e.value)
        assert link.is_symlink()
    assert empty.is_dir() and not any(empty.iterdir()) and not (tmp_path / "missing").exists()
    assert check_new_dir(empty) == empty  # a real empty directory is still a valid output

def test_io_does_not_import_torch():
    code = "import sys, normlab.io; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ------------------------------------------------------------------------------ safe reading (read_bytes, read_json)
def _in_a_child(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with a deadline: a reader that blocked on a FIFO fails the test (timeout)
    instead of hanging the suite."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_read_bytes_refuses_a_fifo_a_device_and_a_directory_without_blocking(tmp_path):
    from normlab.io import read_bytes, read_json

    fifo = tmp_path / "summary.json"
    os.mkfifo(fifo)  # no writer: a blocking open() or read() would wait forever
    code = ("from normlab.io import read_json\n"
            f"try:\n    read_json({str(fifo)!r}, 'summary')\nexcept Exception as e:\n    print(type(e).__name__, e)")
    out = _in_a_child(code).stdout.strip()
    assert out == f"NormlabError summary {fifo} is a FIFO (named pipe), not a regular file; normlab reads only " \
                  "regular files"
    with pytest.raises(NormlabError, match=r"^metrics /dev/null is a character device, not a regular file"):
        read_bytes("/dev/null", "metrics")
    with pytest.raises(NormlabError, match=rf"^config {tmp_path} is a directory, not a regular file"):
        read_bytes(tmp_path, "config")
    with pytest.raises(NormlabError, match=rf"^summary {tmp_path / 'absent.json'} not found$"):
        read_json(tmp_path / "absent.json", "summary")
    link = tmp_path / "link.json"
    link.symlink_to(fifo)  # a symlink is followed: what it names must be a regular file
    with pytest.raises(NormlabError, match="is a FIFO"):
        read_bytes(link, "summary")


def test_read_bytes_caps_the_size_before_reading(tmp_path):
    from normlab.io import MAX_JSON_BYTES, read_bytes, read_json

    big = tmp_path / "summary.json"
    with open(big, "wb") as f:  # sparse: 1 byte over the cap costs no disk and must cost no memory
        f.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(NormlabError) as e:
        read_json(big, "summary")
    assert str(e.value) == (f"summary {big} is {MAX_JSON_BYTES + 1:,} bytes, more than the 64 MiB normlab reads; "
                            "it is not a file normlab wrote (or it is damaged)")
    small = tmp_path / "s.json"
    small.write_bytes(b"x" * 100)
    assert read_bytes(small, max_bytes=100) == b"x" * 100  # exactly the cap is read
    with pytest.raises(NormlabError, match="is 100 bytes, more than"):
        read_bytes(small, max_bytes=99)


@pytest.mark.parametrize("depth,ok", [(64, True), (65, False), (100_000, False)])
def test_json_nesting_is_bounded(tmp_path, depth, ok):
    from normlab.io import MAX_NESTING, nesting_depth, read_json

    p = tmp_path / "deep.json"
    p.write_text("[" * depth + "]" * depth)
    if ok:
        obj = read_json(p)
        assert nesting_depth(obj) == depth == MAX_NESTING
    else:  # 100000 levels would be a RecursionError in json.loads
        with pytest.raises(NormlabError, match=rf"^file {p} is nested more than 64 levels deep"):
            read_json(p)


# ---------------------------------------------------------------------------------------- YAML strictness
def _line_of(text: str, needle: str, nth: int = 0) -> int:
    """1-based line number of the ``nth`` line of ``text`` that starts with ``needle`` (the test's own count)."""
    return [i + 1 for i, line in enumerate(text.splitlines()) if line.startswith(needle)][nth]


DUPLICATES = [  # (YAML text, key, line prefix of the key's occurrences)
    ("model:\n  norm: rmsnorm\ntrain:\n  steps: 4\nmodel:\n  norm: dyt\n", "model", "model:"),
    ("model:\n  norm: rmsnorm\n  width: 32\n  norm: dyt\n", "norm", "  norm:"),
    ("seed: 1\ntrain: {steps: 2}\nseed: 2\n", "seed", "seed:"),
]


@pytest.mark.parametrize("text,key,prefix", DUPLICATES, ids=["section", "nested key", "top-level key"])
def test_duplicate_yaml_keys_name_both_lines(tmp_path, text, key, prefix):
    from normlab.config import read_yaml
    from normlab.experiments.sweep import load_sweep
    from normlab.io import load_yaml

    import yaml

    assert isinstance(yaml.safe_load(text), dict)  # plain PyYAML takes it silently (the last one wins)
    first, second = _line_of(text, prefix, 0), _line_of(text, prefix, 1)
    p = tmp_path / "c.yaml"
    p.write_text(text)
    for read, what in ((read_yaml, "config"), (load_sweep, "sweep file")):
        with pytest.raises(NormlabError) as e:
            read(p)
        assert str(e.value) == (f"{what} {p}: duplicate key '{key}' at lines {first} and {second}; each key may "
                                "appear once in a mapping (merge the two)")
    with pytest.raises(NormlabError, match="--set x: duplicate key 'a' at lines 1 and 1"):
        load_yaml("{a: 1, a: 2}", "--set x")
    assert load_yaml("a: {x: 1}\nb: {x: 1}\n") == {"a": {"x": 1}, "b": {"x": 1}}  # the same key in two mappings


def test_duplicate_section_in_a_config_is_refused_by_train(tmp_path, cache):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  norm: rmsnorm\ntrain:\n  steps: 2\nmodel:\n  norm: dyt\n")
    assert_bad_input(run_inproc("train", str(cfg), "--out", str(tmp_path / "o"), cache=cache),
                     f"config {cfg}: duplicate key 'model' at lines 1 and 5")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("style", ["block", "flow"])
def test_yaml_nesting_is_bounded(tmp_path, style):
    from normlab.io import MAX_NESTING, load_yaml, nesting_depth

    def nested(n: int) -> str:
        if style == "flow":
            return "[" * n + "1" + "]" * n
        return "\n".join("  " * i + f"k{i}:" for i in range(n)) + " 1\n"

    assert nesting_depth(load_yaml(nested(MAX_NESTING))) == MAX_NESTING
    for n in (MAX_NESTING + 1, 2_000 if style == "block" else 50_000):  # past Python's recursion limit in PyYAML
        with pytest.raises(NormlabError, match=r"^YAML: nested more than 64 levels deep \(line \d+\); flatten it$"):
            load_yaml(nested(n))


# -- one numeric reader: integers past Python's 4300-digit conversion limit, JSON nested past json's recursion ------
BIG = "1" * 5001


def test_loads_json_bounds_digits_and_depth_in_one_line():
    from normlab.io import MAX_INT_DIGITS, loads_json

    assert loads_json('{"a": [1, -2, 3.5]}', "x") == {"a": [1, -2, 3.5]}
    assert loads_json("9" * MAX_INT_DIGITS, "x") == int("9" * MAX_INT_DIGITS)  # the bound itself is read
    for text, fragment in ((BIG, "holds an integer of 5,001 digits"), ("[" * 100_000 + "]" * 100_000,
                                                                        "nested more than 64 levels deep"),
                           ('{"a": ' + "9" * (MAX_INT_DIGITS + 1) + "}", f"at most {MAX_INT_DIGITS} digits"),
                           (b"\xff", "not UTF-8"), ("{bad", "invalid JSON")):
        with pytest.raises(NormlabError, match="^x ") as e:
            loads_json(text, "x")
        assert fragment in str(e.value) and "\n" not in str(e.value)


def _damaged(run: Path, tmp_path: Path, name: str, edit) -> Path:
    import shutil

    d = tmp_path / name
    shutil.copytree(run, d)
    edit(d)
    return d


@pytest.mark.parametrize("case", ["config-file", "--set", "jsonl-source", "deep-jsonl-source"])
def test_a_huge_integer_or_deep_json_in_a_training_input_is_one_line_and_writes_nothing(case, tmp_path, cache):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"base: tiny\ntrain:\n  steps: {BIG}\n")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(('{"text": "hello", "n": ' + BIG + "}\n") if case == "jsonl-source"
                      else ("[" * 100_000 + "]" * 100_000 + "\n"))
    argv = {"config-file": ["train", str(cfg)], "--set": ["train", "tiny", "--set", f"seed={BIG}"],
            "jsonl-source": ["train", "tiny", "--set", f"data.source={corpus}"],
            "deep-jsonl-source": ["train", "tiny", "--set", f"data.source={corpus}"]}[case]
    out = tmp_path / "out"
    fragment = "nested more than 64 levels deep" if case.startswith("deep") else "an integer of 5,001 digits"
    assert_bad_input(run_inproc(*argv, "--out", str(out), cache=cache), fragment)
    assert not out.exists()


@pytest.mark.parametrize("file, argv", [("summary.json", ["report"]), ("summary.json", ["advise"]),
                                        ("config.yaml", ["report"]), ("config.yaml", ["advise"]),
                                        ("metrics.jsonl", ["eval", "--documents", "--data"])])
def test_a_huge_integer_in_a_run_directory_is_one_line(file, argv, run, tmp_path, cache):
    """summary.json / config.yaml of a run read by report and advise RUN, and a JSONL corpus scored by eval
    --documents (was: ValueError 'Exceeds the limit (4300 digits)', or an AttributeError in the error path)."""
    def edit(d: Path) -> None:
        p = d / file
        if file == "summary.json":
            p.write_text(p.read_text().replace('"step": 8', f'"step": {BIG}', 1))
        elif file == "config.yaml":
            p.write_text(p.read_text().replace("seed: 0", f"seed: {BIG}", 1))
    d = _damaged(run, tmp_path, "d", edit)
    before = sorted(p.name for p in d.iterdir())
    if argv[0] == "eval":
        corpus = tmp_path / "big.jsonl"
        corpus.write_text('{"text": "hello", "n": ' + BIG + "}\n")
        proc = run_inproc("eval", str(d), *argv[1:], str(corpus), cache=cache)
    else:
        proc = run_inproc(argv[0], str(d), *(["--no-write"] if argv[0] == "advise" else []), cache=cache)
    assert_bad_input(proc, "5,001 digits")
    assert sorted(p.name for p in d.iterdir()) == before  # nothing written


def test_claims_render_of_a_json_with_a_huge_integer_is_one_line(tmp_path, cache):
    src = Path(__file__).resolve().parents[1] / "docs" / "claims-full-2026-11-28.json"
    bad = tmp_path / "claims.json"
    bad.write_text(json.dumps({**json.loads(src.read_text()), "n": "@"}).replace('"@"', BIG))
    assert_bad_input(run_inproc("claims", "--render", str(bad), cache=cache), "5,001 digits")


def test_a_full_disk_is_recorded_and_read_back_as_the_same_error():
    """``disk_full`` recognises ENOSPC / EDQUOT and a library's StorageFull text; ``disk_full_note`` (what a sweep's
    store keeps) reads back as the same errno and path; other errors and other text are not a full disk."""
    import errno
    import os

    from normlab.io import disk_full, disk_full_note, from_disk_full_note

    e = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/runs/a/metrics.jsonl")
    assert disk_full(e) is e
    back = from_disk_full_note(disk_full_note(e))
    assert (back.errno, back.strerror, back.filename) == (errno.EDQUOT, os.strerror(errno.EDQUOT),
                                                            "/runs/a/metrics.jsonl")
    lib = disk_full(RuntimeError('IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'))
    assert lib.errno == errno.ENOSPC and lib.filename is None
    assert from_disk_full_note(disk_full_note(lib)).filename is None
    assert disk_full(OSError(errno.EACCES, "Permission denied", "/x")) is None and disk_full(ValueError("x")) is None
    assert from_disk_full_note("OSError: [Errno 28] No space left on device") is None
    assert from_disk_full_note(None) is None
