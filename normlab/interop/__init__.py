"""Exchange models with Hugging Face ``transformers`` (docs/interop.md).

- ``export_run(run_dir, out)`` -- ``normlab export RUN_DIR --to hf --out DIR``: the HF family a config maps onto
  exactly (``hf_arch``: GPT-2, GPT-NeoX, Llama, Qwen3, Gemma 2, OLMo 2; else a one-line refusal), checked.
- ``import_hf(hf_dir, out)`` -- ``normlab import HF_DIR --out RUN_DIR``: the reverse, checked.
- ``harness.crosscheck(run_dir, hf_dir)`` -- normlab.eval.documents next to lm-evaluation-harness.

``transformers`` (extra ``interop``) and ``lm-eval`` (extra ``lm-eval``) are imported only when used.
"""

from normlab.interop.arch import ARCHS, hf_arch
from normlab.interop.export import export_run
from normlab.interop.hf_import import import_hf

__all__ = ["ARCHS", "export_run", "hf_arch", "import_hf"]
