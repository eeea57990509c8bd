"""Every file name of a run directory, defined once (docs/architecture.md; the layout is in normlab.rundir.readers).

Torch-free and import-free: any module that names a run's file imports it from here.
"""

from __future__ import annotations

CONFIG_FILE = "config.yaml"  # the full resolved config (every key)
MODEL_FILE = "model.safetensors"  # the final weights (normlab.rundir.tensors.save_model); also one per checkpoint
SUMMARY_FILE = "summary.json"  # {status, step, final metrics} (normlab.rundir.readers.read_summary)
METRICS_FILE = "metrics.jsonl"  # one JSON object per logged step (normlab.rundir.readers.read_jsonl)
PARAM_GROUPS_FILE = "param_groups.json"  # optimizer grouping (which parameters get weight decay)
FINGERPRINT_FILE = "fingerprint.json"  # what determines the numbers (normlab.rundir.fingerprint)
TOKENIZER_FILE = "tokenizer.json"  # the run's BPE tokenizer (absent for bytes)
DATA_FILE = "data.json"  # the corpus and tokenizer identity
PROVENANCE_FILE = "provenance.json"  # normlab version, git commit, Python and torch versions
CHECKPOINTS_DIR = "checkpoints"  # resumable checkpoints, one directory per step (normlab.rundir.tensors)
INIT_FROM_FILE = "init_from.json"  # the run a --init-from run started from (normlab.train.init_from)
HF_IMPORT_FILE = "hf_import.json"  # the record of normlab import (normlab.interop.hf_import)
PROBES_FILE = "probes.json"  # in-context probes measured after training (diag.probes; normlab.eval.probes)

__all__ = ["CHECKPOINTS_DIR", "CONFIG_FILE", "DATA_FILE", "FINGERPRINT_FILE", "HF_IMPORT_FILE", "INIT_FROM_FILE",
           "METRICS_FILE", "MODEL_FILE", "PARAM_GROUPS_FILE", "PROBES_FILE", "PROVENANCE_FILE", "SUMMARY_FILE",
           "TOKENIZER_FILE"]
