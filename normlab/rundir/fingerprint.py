"""Run fingerprints: what determines a run's numbers, so caches can tell a run the current code would reproduce from
one it would not (runs know their code).

A fingerprint is the SHA-256 of a canonical JSON object::

    {"config": <the resolved RunConfig dict (config.yaml: every key, vocab filled in)>,
     "parameters": [[name, shape], ...]   # model.named_parameters() in registration order
     "buffers": [[name, shape], ...],     # model.named_buffers() in order (running statistics, RoPE tables)
     "normlab": normlab.__version__, "torch": torch.__version__}

The parameter order is part of it on purpose: the optimizer state, the RNG draws of the initialisation and the
checkpoint layout follow it, so a refactor that reorders parameters changes a seeded run's numbers although its
config is unchanged. The git commit is not part of it (every commit would invalidate every cache); it is recorded
beside it (``RUN_DIR/fingerprint.json``) for the record.

``write_fingerprint(run_dir, cfg, model)`` is called by the training loop once the model is built;
``check_run(run_dir)`` recomputes it from the run's own ``config.yaml`` with the code imported now (the model is
built on the ``meta`` device: no memory, no RNG) and returns None when it matches, else a one-line reason.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from normlab.io import write_json
from normlab.provenance import git_commit
from normlab.rundir.files import FINGERPRINT_FILE
from normlab.rundir.readers import open_config, read_run_file
from normlab.version import __version__


def layout(model: Any) -> dict[str, list]:
    """``{"parameters": [[name, shape]...], "buffers": [[name, shape]...]}`` of a built model, in order."""
    return {"parameters": [[n, list(p.shape)] for n, p in model.named_parameters()],
            "buffers": [[n, list(b.shape)] for n, b in model.named_buffers()]}


def fingerprint_record(cfg: Any, model: Any) -> dict[str, Any]:
    """The fingerprint of a run config ``cfg`` (``RunConfig``, vocab filled in) and its built ``model``: ``{sha256,
    normlab, torch, git_commit, parameters (count of tensors)}`` -- the hash covers config, layout and versions."""
    import torch

    lay = layout(model)
    conf = cfg.identity_dict()  # as RunConfig.hash: without keys added later at their default
    body = {"config": conf, **lay, "normlab": __version__, "torch": torch.__version__}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()
    return {"sha256": digest, "normlab": __version__, "torch": torch.__version__, "git_commit": git_commit(),
            "parameter_tensors": len(lay["parameters"]), "layout": lay}


def write_fingerprint(run_dir: str | Path, cfg: Any, model: Any, *, config_hash: str | None = None
                      ) -> dict[str, Any]:
    """Write ``fingerprint.json``; ``config_hash``: the run's declared config hash (``RunConfig.hash()`` of the
    config as handed over), recorded beside the fingerprint, outside its hash, for a resume that finds no
    checkpoint (``normlab.rundir.readers.read_run_hash``)."""
    rec = fingerprint_record(cfg, model)
    if config_hash:
        rec["config_hash"] = config_hash
    write_json(Path(run_dir) / FINGERPRINT_FILE, rec)
    return rec


def current_fingerprint(cfg: Any) -> dict[str, Any]:
    """The fingerprint the code imported now gives ``cfg`` (built on the meta device)."""
    import torch

    from normlab.model import build_model

    with torch.device("meta"):
        model = build_model(cfg.model)
    return fingerprint_record(cfg, model)


def _layout_change(old: dict, new: dict) -> str:
    """A short description of how two layouts differ (names, shapes or only the order)."""
    for key in ("parameters", "buffers"):
        a, b = old.get(key) or [], new.get(key) or []
        if a == b:
            continue
        na, nb = {n: s for n, s in a}, {n: s for n, s in b}
        if set(na) != set(nb):
            gone, added = sorted(set(na) - set(nb)), sorted(set(nb) - set(na))
            return f"{key} differ (removed {gone[:3]}, added {added[:3]})"
        if na != nb:
            diff = [n for n in na if na[n] != nb[n]]
            return f"{key} shapes differ ({diff[:3]})"
        return f"{key} order changed"
    return "the layout is the same"


def check_run(run_dir: str | Path) -> str | None:
    """None when ``RUN_DIR/fingerprint.json`` matches what the current code builds from ``RUN_DIR/config.yaml``;
    otherwise why not (one line): no fingerprint recorded, another normlab or torch version, a changed parameter
    layout, or a changed resolved config."""
    run_dir = Path(run_dir)
    path = run_dir / FINGERPRINT_FILE
    if not path.is_file():
        return "no fingerprint recorded (trained before run fingerprints)"
    try:
        old = read_run_file(path, "fingerprint", "object")  # a regular file under the size cap, a JSON object
        new = current_fingerprint(open_config(run_dir))
    except Exception as e:  # a corrupt or foreign file: retrain rather than trust it
        return f"fingerprint not checkable ({type(e).__name__}: {e})"
    if old.get("sha256") == new["sha256"]:
        return None
    for key in ("normlab", "torch"):
        if old.get(key) != new[key]:
            return f"trained with {key} {old.get(key)}, now {new[key]}"
    if old.get("layout") != new["layout"]:
        return f"model layout changed: {_layout_change(old.get('layout') or {}, new['layout'])}"
    return "the resolved config differs"
