"""Bad input for the sweep executors (no cluster needed): one line, exit 2, nothing written."""

from __future__ import annotations

import socket
import sys

import pytest
import yaml

from tests.helpers import assert_bad_input, run_inproc

FAST = {"train.steps": 2, "train.eval_every": 2, "train.log_every": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sweep_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "b", "base": "tiny", "set": FAST, "seeds": [0]}))
    return f


def test_ray_missing_is_one_line(sweep_file, tmp_path, cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    for cmd in (["compare", str(sweep_file), "--out", str(tmp_path / "o1")],
                ["claims", "--budget", "tiny", "--out", str(tmp_path / "o2")]):
        assert_bad_input(run_inproc(*cmd, "--executor", "ray", cache=cache), "pip install 'normlab[ray]'")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_bad_address_is_one_line(sweep_file, tmp_path, cache):
    assert_bad_input(run_inproc("compare", str(sweep_file), "--out", str(tmp_path / "o"), "--address", "127.0.0.1:1",
                                cache=cache), "--address needs --executor ray")
    pytest.importorskip("ray")
    port = _free_port()  # nothing listens there
    r = run_inproc("compare", str(sweep_file), "--out", str(tmp_path / "o"), "--executor", "ray", "--address",
                   f"127.0.0.1:{port}", cache=cache)
    assert_bad_input(r, "cannot reach a Ray cluster", f"127.0.0.1:{port}")
    assert_bad_input(run_inproc("compare", str(sweep_file), "--out", str(tmp_path / "o"), "--executor", "ray",
                                "--address", "nohost", cache=cache), "--address must be HOST:PORT")
    assert_bad_input(run_inproc("claims", "--budget", "tiny", "--out", str(tmp_path / "o"), "--executor", "ray",
                                "--address", f"127.0.0.1:{port}", cache=cache), "cannot reach a Ray cluster")
    assert not (tmp_path / "o").exists()
