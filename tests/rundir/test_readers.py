"""normlab.rundir.readers: a damaged run directory is one line naming what is wrong (and nothing is written); junk and
non-UTF-8 metrics lines are skipped.

Self-contained run directories (normlab.rundir.readers): the run keeps its tokenizer, data identity and provenance; it
works after being moved, from any working directory, with an empty token cache; a changed corpus is refused with
one line naming what changed; ``--data`` scores another corpus with the run's own tokenizer."""

from __future__ import annotations

import hashlib
import json
import shutil
import sysconfig
from pathlib import Path

import pytest

import normlab
from normlab.data import BPETokenizer, split_docs
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

    def empty_config(d: Path) -> None:
        (d / "config.yaml").write_text("")

    def no_optim(d: Path) -> None:
        text = (d / "config.yaml").read_text()
        (d / "config.yaml").write_text(text.replace("\noptim:", "\noptim_gone:"))

    def symlink_diagnostics(d: Path) -> None:
        outside = d.parent / "outside"
        outside.mkdir()
        shutil.rmtree(d / "diagnostics", ignore_errors=True)
        (d / "diagnostics").symlink_to(outside)

    return {"summary_list": summary_list, "touch_diagnostics": touch_diagnostics, "mkdir_eval": mkdir_eval,
            "mkdir_reliability": mkdir_reliability, "symlink_diagnostics": symlink_diagnostics,
            "empty_config": empty_config, "no_optim": no_optim}[name]


DAMAGED_RUN = [  # (damage, command after RUN, fragments, files that must not appear)
    ("summary_list", ["diagnose", "RUN"], ["summary", "must hold a JSON object", "summary.json"], ["diagnostics.json"]),
    ("summary_list", ["train", "--resume", "RUN"], ["summary", "must hold a JSON object"], []),
    ("touch_diagnostics", ["diagnose", "RUN"], ["diagnostics", "is a file, not a directory"], ["diagnostics.json"]),
    ("mkdir_eval", ["eval", "RUN", "--max-tokens", "256"], ["eval_val.json", "is a directory"], []),
    ("mkdir_reliability", ["calibrate", "RUN", "--max-tokens", "256"], ["reliability.png", "is a directory"],
     ["calibration.json"]),
    ("symlink_diagnostics", ["diagnose", "RUN"], ["refusing to write", "outside"], ["diagnostics.json"]),
    # an empty config.yaml is not the defaults (which would build another model, or resume another run)
    ("empty_config", ["eval", "RUN", "--max-tokens", "256"], ["config.yaml is empty"], ["eval_val.json"]),
    ("empty_config", ["train", "--resume", "RUN"], ["config.yaml is empty"], []),
    ("no_optim", ["eval", "RUN", "--max-tokens", "256"], ["config.yaml has no 'optim' mapping"], ["eval_val.json"]),
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


# ---------------------------------------------------------------- self-contained run directories
SHORT = ["--set", "train.steps=4", "--set", "train.eval_every=2", "--set", "train.checkpoint_every=2",
         "--set", "data.tokenizer=bpe:300", "--set", "model.context=32"]


def _text(names: list[str]) -> bytes:
    """Real text: some files of the installed standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return b"".join((root / n).read_bytes() for n in names)


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """Train in directory A on the relative corpus ``corpus.txt``; evaluate there; move the run to B."""
    base = tmp_path_factory.mktemp("selfcontained")
    a, b = base / "a", base / "b"
    a.mkdir()
    b.mkdir()
    (a / "corpus.txt").write_bytes(_text(["textwrap.py", "shlex.py", "fnmatch.py"]))
    mp = pytest.MonkeyPatch()
    mp.chdir(a)
    try:
        run_inproc("train", "tiny", *SHORT, "--set", "data.source=corpus.txt", "--out", "run",
                   cache=base / "cache1", check=True)
        before = json.loads(run_inproc("eval", "run", "--json", cache=base / "cache1", check=True).stdout)
    finally:
        mp.undo()
    shutil.move(str(a / "run"), str(b / "run"))
    return {"base": base, "corpus": a / "corpus.txt", "run": b / "run", "before": before}


def test_run_directory_records_identity_and_provenance(moved):
    run, corpus = moved["run"], moved["corpus"]
    info = json.loads((run / "data.json").read_text())
    raw = corpus.read_bytes()
    h = hashlib.sha256(len(raw).to_bytes(8, "little") + raw).hexdigest()  # content_hash of one document
    assert info["content_hash"] == h and info["num_bytes"] == len(raw) and info["num_docs"] == 1
    assert info["source"] == "corpus.txt" and info["resolved_source"] == str(corpus.resolve())
    assert info["splits"]["val_fraction"] == 0.05 and info["data_order_seed"] == 0
    assert sum(info["splits"]["bytes"].values()) == len(raw)
    tok = info["tokenizer"]
    assert tok["kind"] == "bpe" and tok["vocab_size"] == 300
    assert tok["sha256"] == hashlib.sha256((run / "tokenizer.json").read_bytes()).hexdigest()
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["normlab_version"] == normlab.__version__
    assert prov["git_commit"] is None or len(prov["git_commit"]) == 40


def test_moved_run_works_from_another_directory_with_an_empty_cache(moved, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # neither the training directory nor the run's parent
    after = json.loads(run_inproc("eval", str(moved["run"]), "--json", cache=tmp_path / "fresh", check=True).stdout)
    assert after["bpb"] == moved["before"]["bpb"]
    assert after["tokens"] == moved["before"]["tokens"]


def test_data_scores_another_corpus_with_the_runs_tokenizer(moved, tmp_path):
    other = tmp_path / "other.txt"
    other_bytes = _text(["glob.py", "bisect.py", "colorsys.py"])
    other.write_bytes(other_bytes)
    run = moved["run"]
    plain = (run / "eval_val.json").read_text()
    m = json.loads(run_inproc("eval", str(run), "--data", str(other), "--json", cache=moved["base"] / "cache1",
                              check=True).stdout)
    # the run's own tokenizer.json encodes the other corpus's val split into exactly the tokens scored
    # (a BPE retrained on the other corpus would give another count)
    val = split_docs([other_bytes], 0.05, 0.05)["val"]
    ids = BPETokenizer.from_file(run / "tokenizer.json").encode_docs(val)
    tb = BPETokenizer.from_file(run / "tokenizer.json").token_bytes()
    assert m["tokens"] == len(ids) - 1 and m["bytes"] == int(tb[ids[1:]].sum())  # every token but the first is a target
    assert m["data"]["source"] == str(other)
    assert (run / f"eval_val_data-{m['data']['content_hash'][:12]}.json").is_file()
    assert (run / "eval_val.json").read_text() == plain  # the plain evaluation is not overwritten
    c = json.loads(run_inproc("calibrate", str(run), "--data", str(other), "--json", "--max-tokens", "200",
                              cache=moved["base"] / "cache1", check=True).stdout)
    assert c["data"]["content_hash"] == m["data"]["content_hash"]


def test_changed_corpus_is_refused(moved, tmp_path):
    corpus, run = moved["corpus"], moved["run"]
    original = corpus.read_bytes()
    try:
        corpus.write_bytes(original + b"# appended\n")
        cache = tmp_path / "cache"
        for cmd in (["eval", str(run)], ["diagnose", str(run)], ["calibrate", str(run)],
                    ["extrapolate", str(run), "--factors", "1"]):
            proc = run_inproc(*cmd, cache=cache)
            assert_bad_input(proc, "changed since", f"size {len(original):,} -> {len(original) + 11:,} bytes",
                             "--data")
        assert not list(cache.glob("*bpe*"))  # refused before anything was tokenized
    finally:
        corpus.write_bytes(original)


def test_generate_needs_no_corpus_and_a_modified_tokenizer_is_refused(moved, tmp_path):
    src, run = moved["run"], tmp_path / "copy"
    shutil.copytree(src, run)
    corpus = moved["corpus"]
    hidden = corpus.with_suffix(".hidden")
    corpus.rename(hidden)
    try:
        g = json.loads(run_inproc("generate", str(run), "--prompt", "def ", "--max-new-tokens", "5",
                                  "--temperature", "0", "--json", cache=tmp_path / "c", check=True).stdout)
        assert len(g["tokens"]) == 5 and all(0 <= t < 300 for t in g["tokens"])
        expected = BPETokenizer.from_file(run / "tokenizer.json").decode(g["tokens"])  # str: UTF-8 with replacement
        assert g["text"] == expected
        assert_bad_input(run_inproc("eval", str(run), cache=tmp_path / "c"), "is gone", "--data")
    finally:
        hidden.rename(corpus)
    tok = json.loads((run / "tokenizer.json").read_text())
    (run / "tokenizer.json").write_text(json.dumps(tok, indent=1))
    assert_bad_input(run_inproc("eval", str(run), cache=tmp_path / "c"), "tokenizer.json was modified")


# ----------------------------------------------------------------------- readers refuse what they cannot trust
def test_readers_refuse_fifos_and_oversize_files_without_blocking(tmp_path):
    """``read_summary`` / ``read_jsonl`` go through ``normlab.io.read_bytes``: a FIFO is one line (never opened for
    a blocking read), so is a metrics file over the cap; ``last_step`` (the progress display) gives None for a
    FIFO; a file given as a run directory says it is a file."""
    import os
    import subprocess
    import sys

    from normlab.errors import NormlabError
    from normlab.io import MAX_JSONL_BYTES
    from normlab.rundir.readers import open_config, read_jsonl, read_summary

    os.mkfifo(tmp_path / "summary.json")
    os.mkfifo(tmp_path / "metrics.jsonl")
    code = (f"from normlab.rundir.readers import read_summary, read_jsonl, last_step\nfrom pathlib import Path\n"
            f"d = Path({str(tmp_path)!r})\nprint(last_step(d / 'metrics.jsonl'))\n"
            "for f in (lambda: read_summary(d), lambda: read_jsonl(d / 'metrics.jsonl')):\n"
            "    try:\n        f()\n    except Exception as e:\n        print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.splitlines() == [
        "None",
        f"NormlabError summary {tmp_path / 'summary.json'} is a FIFO (named pipe), not a regular file; normlab reads "
        "only regular files",
        f"NormlabError metrics {tmp_path / 'metrics.jsonl'} is a FIFO (named pipe), not a regular file; normlab reads "
        "only regular files"]
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "metrics.jsonl", "wb") as f:
        f.truncate(MAX_JSONL_BYTES + 1)  # sparse
    with pytest.raises(NormlabError, match="more than the 256 MiB normlab reads"):
        read_jsonl(big / "metrics.jsonl")
    assert read_jsonl(big / "absent.jsonl") == [] and read_summary(big) is None
    with pytest.raises(NormlabError, match=rf"^run directory {big / 'metrics.jsonl'} is a file, not a directory$"):
        open_config(big / "metrics.jsonl")


def test_read_summary_checks_the_type_of_every_key_readers_use(tmp_path):
    from normlab.errors import NormlabError
    from normlab.rundir.readers import SUMMARY_TYPES, read_summary

    good = {"status": "completed", "step": 3, "steps": 3, "val_bpb": 1.25, "best_val_bpb": None, "tokens_per_s": 10,
            "config_hash": "abc", "extra": {"any": "thing"}}
    (tmp_path / "summary.json").write_text(json.dumps(good))
    assert read_summary(tmp_path) == good  # null, int-for-float and keys normlab does not read are fine
    for key, types in SUMMARY_TYPES.items():
        for bad in (True, "1.5" if str not in types else 1.5, [1], {"a": 1}):
            (tmp_path / "summary.json").write_text(json.dumps({**good, key: bad}))
            with pytest.raises(NormlabError, match=rf'^summary {tmp_path / "summary.json"}: "{key}" is '):
                read_summary(tmp_path)


def test_the_runs_tokenizer_and_data_identity_are_read_safely(tmp_path):
    """``tokenizer_ref`` reads the run's tokenizer.json through ``read_bytes`` (a FIFO is one line, not a wait) and
    checks its sha256 against data.json; ``read_data_info`` refuses a tokenizer ``file`` that leaves the run
    directory and fields of the wrong type."""
    import hashlib
    import os
    import subprocess
    import sys

    from normlab.errors import NormlabError
    from normlab.rundir.readers import read_data_info, tokenizer_ref

    tok = b'{"model": {"type": "BPE"}}'
    info = {"content_hash": "c", "tokenizer": {"kind": "bpe", "file": "tokenizer.json",
                                               "sha256": hashlib.sha256(tok).hexdigest()}}
    (tmp_path / "data.json").write_text(json.dumps(info))
    (tmp_path / "tokenizer.json").write_bytes(tok)
    assert tokenizer_ref(tmp_path, read_data_info(tmp_path)) == tmp_path / "tokenizer.json"
    (tmp_path / "tokenizer.json").write_bytes(tok + b" ")
    with pytest.raises(NormlabError, match="was modified since training"):
        tokenizer_ref(tmp_path, read_data_info(tmp_path))
    (tmp_path / "tokenizer.json").unlink()
    os.mkfifo(tmp_path / "tokenizer.json")
    code = ("from pathlib import Path\nfrom normlab.rundir.readers import read_data_info, tokenizer_ref\n"
            f"d = Path({str(tmp_path)!r})\ntry:\n    tokenizer_ref(d, read_data_info(d))\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    assert out == (f"NormlabError tokenizer {tmp_path / 'tokenizer.json'} is a FIFO (named pipe), not a regular "
                   "file; normlab reads only regular files")
    for bad, why in (({**info, "tokenizer": "bpe"}, "tokenizer an object"),
                     ({**info, "content_hash": 1}, "content_hash must be text"),
                     ({**info, "tokenizer": {**info["tokenizer"], "file": "../elsewhere.json"}}, "tokenizer.file"),
                     ({**info, "tokenizer": {**info["tokenizer"], "file": ".."}}, "tokenizer.file")):
        (tmp_path / "data.json").write_text(json.dumps(bad))
        with pytest.raises(NormlabError, match=why):
            read_data_info(tmp_path)


def test_run_sections_are_every_mapping_a_run_config_writes():
    """open_config requires every section a run's config.yaml holds: the list is RunConfig's own mappings."""
    from normlab.config import RunConfig
    from normlab.rundir.readers import RUN_SECTIONS

    assert sorted(RUN_SECTIONS) == sorted(k for k, v in RunConfig().to_dict().items() if isinstance(v, dict))


# ------------------------------------------------------------------- metrics.jsonl streamed (normlab report's reader)
def _old_read_jsonl(path: Path) -> list[dict]:
    """The reader before streaming, as it was: the whole file, ``splitlines``, ``json.loads`` per line."""
    out = []
    for raw in path.read_bytes().splitlines():
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step", 0), int) and not isinstance(rec.get("step"), bool):
            out.append(rec)
    return out


def _awkward_metrics(path: Path) -> None:
    lines = [b'{"step": 0, "init_val_loss": 5.5, "init_val_bpb": 7.9}', b'{"step": 1, "loss": 2.5, "lr": 0.001}',
             b'{"step": 2, "loss": NaN, "lr": 1e-3, "note": "text", "flag": true, "d": {"x": 1}}',
             b'not json', b'', b'\xff\xfe junk', b'{"step": true, "loss": 1.0}', b'{"step": 2.5, "loss": 1.0}',
             b'{"loss": 9.0}', b'[1, 2]', b'{"step": 3, "loss": 2.25}\r', b'{"step": 4, "loss": 2.0}\r{"step": 5}',
             b'{"step": 6, "val_bpb": 1.5, "loss": 1.75, "big": ' + b"9" * 30 + b"}"]
    path.write_bytes(b"\n".join(lines) + b'\n{"step": 7, "loss": 1.')  # the last line cut by a kill -9


def test_streamed_reader_gives_the_old_readers_rows(tmp_path):
    """``iter_jsonl`` (line by line, bounded JSON reader) keeps exactly the records the whole-file reader kept (cut,
    junk, non-UTF-8, non-object lines and non-integer steps dropped; ``\\r`` ends a line as ``splitlines`` does),
    and ``read_curves`` holds exactly ``read_metrics``'s points, per key in file order."""
    from normlab.rundir.curves import Curve
    from normlab.rundir.readers import iter_jsonl, read_curves, read_jsonl, read_metrics

    path = tmp_path / "metrics.jsonl"
    _awkward_metrics(path)
    old = _old_read_jsonl(path)
    assert [r.get("step") for r in old] == [0, 1, 2, None, 3, 4, 5, 6] and "loss" in old[-1]
    it = iter_jsonl(path)
    assert not isinstance(it, list) and iter(it) is it  # an iterator, consumed as read
    assert json.dumps(list(it)) == json.dumps(old) == json.dumps(read_jsonl(path))  # NaN compared as text
    expect: dict[str, list] = {}
    for rec in old:
        for k, v in rec.items() if "step" in rec else ():  # the old read_metrics: records with a step
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                expect.setdefault(k, []).append((rec["step"], float(v)))
    curves = read_curves(path)
    assert all(isinstance(c, Curve) for c in curves.values())
    assert {k: [(s, repr(v)) for s, v in c] for k, c in curves.items()} == \
        {k: [(s, repr(v)) for s, v in pts] for k, pts in expect.items()}
    assert sorted((s, k, repr(v)) for s, k, v in read_metrics(path)) == \
        sorted((s, k, repr(v)) for k, pts in expect.items() for s, v in pts)
    assert read_curves(tmp_path / "absent.jsonl") == {} and list(iter_jsonl(tmp_path / "absent.jsonl")) == []
    # where the two differ, on purpose: a line the bounded reader refuses (an integer past 100 digits, nesting past
    # 64 levels: the old reader's RecursionError) is skipped like any junk line
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "big": ' + "9" * 101 + '}\n' + '[' * 100000 + '\n')
    assert read_jsonl(path) == [{"step": 1, "loss": 2.0}]


def test_curves_of_a_large_metrics_file_take_memory_in_proportion_to_its_numbers(tmp_path):
    """Reading a ~6 MB metrics file into columns never holds the file, its lines or its parsed records: the peak
    of Python allocations stays under 24 bytes per number (16 in the columns, plus their growth) plus one 1 MiB
    read chunk and a few lines, far below the file's size (the whole-file reader's peak exceeds the file)."""
    import tracemalloc

    from normlab.rundir.readers import read_curves

    path = tmp_path / "metrics.jsonl"
    keys = [f"diag/resid_var/{b}" for b in range(12)] + ["loss", "lr", "grad_norm"]
    numbers = 0
    with open(path, "w") as f:
        for step in range(1, 20001):
            rec = {"step": step, **{k: step * 1e-3 + i for i, k in enumerate(keys)}}
            f.write(json.dumps(rec) + "\n")
            numbers += len(keys)
    size = path.stat().st_size
    assert size > 5_000_000
    tracemalloc.start()
    try:
        curves = read_curves(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(len(c) for c in curves.values()) == numbers
    assert peak < 24 * numbers + 2 * 2**20, (peak, numbers, size)
    assert peak < size  # the whole-file reader holds the file and its lines: more than twice its size


def test_metrics_growing_past_the_cap_while_streamed_is_refused(tmp_path):
    """The file is checked when the reader is made and counted as it is read: one that grows past the cap in
    between is one line, not an unbounded read."""
    from normlab.errors import NormlabError
    from normlab.io import read_lines

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n' * 10)
    lines = read_lines(path, "metrics", max_bytes=200)
    with open(path, "ab") as f:
        f.write(b'{"step": 2}\n' * 10)
    with pytest.raises(NormlabError, match=rf"^metrics {path} grew past the .* MiB normlab reads while being read$"):
        list(lines)
    assert list(read_lines(path, "metrics", max_bytes=400)) == [b'{"step": 1}'] * 10 + [b'{"step": 2}'] * 10


def test_last_step_skips_a_tail_line_the_bounded_reader_refuses(tmp_path):
    """The progress display's tail reader: a last line nested 100k deep or holding a 5001-digit integer is junk
    (the step before it is the last one), not a RecursionError / ValueError out of the display."""
    from normlab.rundir.readers import last_step

    path = tmp_path / "metrics.jsonl"
    for junk in ("[" * 5000, '{"step": ' + "9" * 5001 + "}"):
        path.write_text('{"step": 7, "loss": 1.0}\n' + junk + "\n")
        assert last_step(path) == 7
