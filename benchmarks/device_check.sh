#!/usr/bin/env bash
# The device checks of docs/gpu.md as one script, sized for one call of at most 10 minutes (a session that is lent a
# GPU has 15 minutes of device time in all, the machine's start included). Run from the repository root on a
# machine with a CUDA device, with the interpreter that holds PyTorch (PYTHON, default python3; normlab need not be
# installed: the checkout is put on PYTHONPATH). Everything it measures goes under OUT (default device-out/), a few
# files no deeper than one folder, and each step is cut at its own time limit so that the next still runs:
#
#   1. tests/test_cuda.py                    correctness on CUDA (train, kill -9 resume, stacked == alone, no
#                                             host reads between read points, the fused RoPE kernel)   <= 270 s
#   2. benchmarks/deterministic_cost.py       what train.deterministic costs, and which operator       <= 80 s
#   3. benchmarks/gpu_speed.py --costs defaults --modes compiled --shapes issue
#                                             nanoGPT's compiled train.py against normlab's defaults, only if a
#                                             nanoGPT checkout is at NANOGPT (default .nanogpt/)     <= 160 s
#   4. one run of the scale preset's first config for 100 steps, its tokens/s: the rate from which the scale
#      preset's 320 runs (with --replicate-on english) are estimated                           <= 80 s
#
# The full scale preset, claims --budget scale and make demo on the GPU do not fit one call; run them in later
# calls, each alone, with the estimate of step 4. Usage: bash benchmarks/device_check.sh
set -uo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-device-out}
NANOGPT=${NANOGPT:-.nanogpt}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
step() { echo "== $1 ($(date -u +%H:%M:%S))" | tee -a "$OUT/steps.log"; }

step "device"
$PY -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" 2>&1 \
  | tee "$OUT/device.txt"

step "1 tests/test_cuda.py"
timeout 270 $PY -m pytest -q -x -p no:cacheprovider --durations=15 tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log"
echo "test_cuda exit ${PIPESTATUS[0]}" | tee -a "$OUT/steps.log"

step "2 deterministic_cost"
timeout 80 $PY benchmarks/deterministic_cost.py --shape demo --steps 20 --out "$OUT/deterministic_cost.md" 2>&1 \
  | tail -40
echo "deterministic_cost exit ${PIPESTATUS[0]}" | tee -a "$OUT/steps.log"

step "3 gpu_speed"
if [ -f "$NANOGPT/train.py" ]; then
  timeout 160 $PY benchmarks/gpu_speed.py --nanogpt "$NANOGPT" --shapes issue --steps 80 --costs defaults \
    --modes compiled --no-demo --out "$OUT/gpu_speed.md" 2>&1 | tee "$OUT/gpu_speed.log"
  echo "gpu_speed exit ${PIPESTATUS[0]}" | tee -a "$OUT/steps.log"
else
  echo "gpu_speed skipped: no nanoGPT checkout at $NANOGPT (carry one: docs/gpu.md)" | tee -a "$OUT/steps.log"
fi

step "4 scale probe"
timeout 80 $PY - <<'PYEOF' 2>&1 | tee -a "$OUT/steps.log"
import json, os, subprocess, sys, time
from pathlib import Path

import yaml

from normlab.experiments.sweep import load_sweep

steps = int(os.environ.get("SCALE_PROBE_STEPS", "100"))
sweep = load_sweep(preset="scale")
cfg = json.loads(json.dumps(sweep.runs[0].config))
cfg["device"] = os.environ.get("SCALE_PROBE_DEVICE", cfg["device"])  # a dry run of this script on a CPU: cpu
full_steps, t = cfg["train"]["steps"], cfg["train"]
t.update(steps=steps, eval_every=steps, checkpoint_every=steps, log_every=max(1, steps // 10), track=[])
work = Path(os.environ.get("TMPDIR", "/tmp")) / "normlab-scale-probe"  # not under OUT: only a few files come back
work.mkdir(parents=True, exist_ok=True)
(work / "scale-probe.yaml").write_text(yaml.safe_dump(cfg))
t0 = time.time()
r = subprocess.run([sys.executable, "-m", "normlab", "train", str(work / "scale-probe.yaml"), "--out",
                    str(work / "run"), "--json"], capture_output=True, text=True)
wall = time.time() - t0
if r.returncode != 0:
    print("scale probe failed:", (r.stderr.strip().splitlines() or ["?"])[-1])
    sys.exit(1)
s = json.loads(r.stdout)
tps = s["tokens_per_s"]
per_step = t["batch_size"] * t.get("grad_accum", 1) * cfg["model"]["context"]
fixed = max(0.0, wall - steps * per_step / tps)  # start-up, data, compile: paid once per run
per_run = fixed + full_steps * per_step / tps
n = 2 * len(sweep.runs)
print(f"scale probe: {tps:,.0f} tokens/s over {steps} steps, {wall:.1f} s wall ({fixed:.1f} s of it start-up and "
      f"compile); one {full_steps}-step run ~{per_run:.0f} s; the preset with its replication ({n} runs) "
      f"~{n * per_run / 60:.0f} min one after another (stacked groups share start-up and kernels: less)")
PYEOF
step "done"
