"""A data-parallel rank of ``normlab train``, watched (``tests/train/test_distributed.py``). Launched by torchrun in
place of ``-m normlab``::

    python -m torch.distributed.run --nproc-per-node 2 ... -m tests.train.rank_probe train CONFIG ...

It does what ``normlab.cli.entry`` does (the process policies, before torch is imported, then ``normlab.cli.main``)
inside ``tests.helpers.HostReads`` (the CPU stand-in for ``torch.cuda.set_sync_debug_mode``: every host read of a
tensor's value, per step; a step starts where the loop asks whether it is a read point) and writes
``$NORMLAB_TEST_RANK_DIR/rank<R>.json``: the summary its ``train`` returned and its reads.

``NORMLAB_TEST_DEFER=1``: reads deferred to read points as on an accelerator (``normlab.train.loop.defer_reads``
answers True: the CPU stand-in for a data-parallel run on GPUs); else every step is read as on the CPU (every step
a read point: what ``defer_reads`` False does). Compare runs of this module with each other: the counting's
dispatch mode changes the last bit of a float64 SVD (the diagnostics' spectral norm), not the training.
``NORMLAB_TEST_SYNC_ERROR=1`` (a CUDA run): ``torch.cuda.set_sync_debug_mode("error")`` around every step between
read points after the first two (which compile), so that any host wait for the device there raises.
``NORMLAB_TEST_STEP_DELAY=S``: sleep S seconds before every step (no number changes), so that a signal sent at a
checkpoint lands long before the run could end, however loaded the machine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from normlab.cli import main, set_process_policies


def run_rank(argv: list[str]) -> int:
    set_process_policies()
    # torch after the process policies, as normlab.cli.entry has it (tests.helpers imports it too)
    import torch

    import normlab.train.loop as loop
    from tests.helpers import HostReads

    defer = os.environ.get("NORMLAB_TEST_DEFER") == "1"
    sync_error = os.environ.get("NORMLAB_TEST_SYNC_ERROR") == "1"
    delay = float(os.environ.get("NORMLAB_TEST_STEP_DELAY", "0"))
    got: dict = {}
    reads = HostReads()
    read_point, finish = loop.Recipe._read_point, loop.Recipe._finish

    def marked(self, i: int) -> bool:  # a step starts here: every step asks (defer_reads answers True)
        reads.step = i
        time.sleep(delay)
        read = read_point(self, i) or not defer  # not deferred: every step is a read point, as on the CPU
        if sync_error:
            torch.cuda.set_sync_debug_mode("error" if (i >= 2 and not read) else "default")
        return read

    def finished(self) -> dict:
        got["summary"] = summary = finish(self)
        return summary

    loop.defer_reads = lambda cfg: True
    loop.Recipe._read_point, loop.Recipe._finish = marked, finished
    try:
        with reads:
            return main(argv)
    finally:
        got["reads"] = reads.reads
        Path(os.environ["NORMLAB_TEST_RANK_DIR"], f"rank{os.environ['RANK']}.json").write_text(json.dumps(got))


if __name__ == "__main__":
    sys.exit(run_rank(sys.argv[1:]))
