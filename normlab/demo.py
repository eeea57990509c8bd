"""``make demo``: the comparison. Runs ``normlab compare --preset quick`` on the built-in ``pystdlib`` corpus
(the preset's variants x its learning-rate grid x its seeds, in parallel: normlab/configs/sweeps/quick.yaml and
docs/compare.md), writes the report and prints its path, the LR-sensitivity ranking and the paired differences
with Pre-LN. The previous one-learning-rate demo is
``normlab compare --preset quick-1lr``.

The sweep directory is ``runs/demo-quick-<sweep hash>``: re-running resumes an interrupted demo and skips finished
runs; an edited preset gets a fresh directory.
"""

from __future__ import annotations

import sys
import time

from normlab.cli import main as cli
from normlab.cli import set_process_policies


def main() -> int:
    set_process_policies()  # as the normlab command does, before torch is imported (the sweep workers inherit it)
    from normlab.experiments.sweep import load_sweep

    t0 = time.time()
    sweep = load_sweep(preset="quick")
    out = f"runs/demo-quick-{sweep.hash[:8]}"
    code = cli(["compare", "--preset", "quick", "--out", out])
    if code == 0:
        print(f"\ndemo finished in {time.time() - t0:.0f}s; open {out}/report.html "
              f"(or {out}/report.md); TensorBoard: tensorboard --logdir {out}/tb "
              "(pip install 'normlab[tensorboard]')")
    return code


if __name__ == "__main__":
    sys.exit(main())
