"""``make demo``: train the ``small`` preset on the built-in ``pystdlib`` corpus, evaluate it, print the numbers.

Re-running it resumes (or, when finished, reuses) the same run directory ``runs/demo-small-<config hash>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from normlab.cli import main as cli


def main() -> int:
    from normlab.config import load_config

    cfg = load_config("small")
    run_dir = Path("runs") / f"demo-small-{cfg.hash()[:8]}"
    args = ["train", "--resume", str(run_dir)] if (run_dir / "config.yaml").exists() else ["train", "small", "--out", str(run_dir)]
    code = cli(args)
    if code != 0:
        return code
    code = cli(["eval", str(run_dir), "--split", "val"])
    if code != 0:
        return code
    m = json.loads((run_dir / "eval_val.json").read_text())
    print(f"\nrun directory: {run_dir}")
    print(f"validation: {m['loss']:.4f} nats/token, {m['bits_per_byte']:.4f} bits/byte, "
          f"byte perplexity {m['byte_perplexity']:.3f}, word perplexity {m['word_perplexity']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
