"""normlab.rundir.publish: the one writer of a finished run directory, checked against what the readers load back."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from normlab.config import load_config
from normlab.errors import NormlabError
from normlab.model import build_model
from normlab.rundir.files import CONFIG_FILE, DATA_FILE, MODEL_FILE, PROVENANCE_FILE, SUMMARY_FILE, TOKENIZER_FILE
from normlab.rundir.publish import publish_run, write_run
from normlab.rundir.readers import load_run, read_summary


@pytest.fixture
def small():
    cfg = load_config("tiny", ["model.width=16", "model.depth=1", "model.heads=2"])
    torch.manual_seed(0)
    return cfg, build_model(cfg.model)


def _source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name, text in ((TOKENIZER_FILE, '{"t": 1}'), (DATA_FILE, '{"d": 2}'), (PROVENANCE_FILE, '{"p": 3}')):
        (src / name).write_text(text)
    return src


def test_publish_run_writes_a_run_the_readers_load_back(small, tmp_path):
    cfg, model = small
    src, out = _source(tmp_path), tmp_path / "out"
    with publish_run(out, cfg, model, derived_from=src) as pending:
        assert not out.exists() and (pending.path / CONFIG_FILE).is_file()
        back = load_run(pending.path, final_only=True)  # what was written, before it is published
        pending.records["check.json"] = {"ok": True}
        pending.summary = {"status": "completed", "step": 0}
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [CONFIG_FILE, MODEL_FILE, SUMMARY_FILE, TOKENIZER_FILE, DATA_FILE, PROVENANCE_FILE, "check.json"])
    loaded = load_run(out, final_only=True)
    for a, b, c in zip(model.state_dict().values(), loaded.model.state_dict().values(),
                       back.model.state_dict().values(), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert loaded.cfg.hash() == cfg.hash() and yaml.safe_load((out / CONFIG_FILE).read_text()) == cfg.to_dict()
    assert read_summary(out) == {"status": "completed", "step": 0}
    assert json.loads((out / "check.json").read_text()) == {"ok": True}
    assert [(out / n).read_text() for n in (TOKENIZER_FILE, DATA_FILE, PROVENANCE_FILE)] == [
        '{"t": 1}', '{"d": 2}', '{"p": 3}']
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_failed_check_or_a_missing_summary_publishes_nothing(small, tmp_path):
    cfg, model = small
    out = tmp_path / "out"
    with pytest.raises(NormlabError, match="failed its check"):
        with publish_run(out, cfg, model) as pending:
            pending.summary = {"status": "completed"}
            raise NormlabError("failed its check")
    with pytest.raises(NormlabError, match="without a summary"):
        with publish_run(out, cfg, model):
            pass
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_write_run_fills_an_existing_directory(small, tmp_path):
    cfg, model = small
    src = _source(tmp_path)
    stage = tmp_path / "build" / "stages" / "01"
    write_run(stage, cfg, model, {"status": "completed"}, derived_from=src, records={"r.json": {"k": [1, 2]}})
    assert read_summary(stage) == {"status": "completed"} and (stage / TOKENIZER_FILE).read_text() == '{"t": 1}'
    assert json.loads((stage / "r.json").read_text()) == {"k": [1, 2]}
    assert load_run(stage, final_only=True).cfg.hash() == cfg.hash()


def test_finish_run_writes_the_weights_then_the_summary_last(small, tmp_path, monkeypatch):
    import normlab.rundir.publish as publish

    cfg, model = small
    run = tmp_path / "run"
    publish.write_config(run, cfg)
    assert yaml.safe_load((run / CONFIG_FILE).read_text()) == cfg.to_dict()
    seen = []
    real = publish.write_json
    monkeypatch.setattr(publish, "write_json",
                        lambda path, obj: (seen.append((path.name, (run / MODEL_FILE).is_file())), real(path, obj)))
    publish.finish_run(run, cfg, model, {"status": "completed", "step": 3})
    assert seen == [(SUMMARY_FILE, True)]  # the weights were on disk when the summary was written
    assert read_summary(run) == {"status": "completed", "step": 3}
    for a, b in zip(model.state_dict().values(), load_run(run, final_only=True).model.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)
    stopped = tmp_path / "stopped"
    publish.write_config(stopped, cfg)
    publish.finish_run(stopped, cfg, None, {"status": "interrupted"})  # a stopped run: no weights, a summary
    assert sorted(p.name for p in stopped.iterdir()) == [CONFIG_FILE, SUMMARY_FILE]
