#!/usr/bin/env bash
# The device checks of docs/gpu.md as one call of at most 8 minutes (a session that is lent a GPU has 15 minutes of
# device time in all, the machine's start included): benchmarks/device_check.py, cut at 470 s in all, each of its
# steps at its own limit (device 30 s, tests/test_cuda.py 150 s, the nanoGPT comparison with its gap attribution
# 150 s, stacked against one-at-a-time at the demo and scale shapes 70 s, the scale preset's estimate from
# steady-state tokens/s 30 s). Results are written after every step: OUT/results.json and OUT/device_check.md (and
# OUT/test_cuda.log, OUT/device_check.log), a few files no deeper than OUT.
#
# Run from the repository root with the interpreter that holds PyTorch (PYTHON, default python3; normlab need not
# be installed: the checkout is put on PYTHONPATH). NANOGPT: a karpathy/nanoGPT checkout (default .nanogpt/; without
# one its row is skipped). DRY_RUN=1: the same steps on the CPU at small shapes (tests/test_cuda.py runs it in
# make test), numbers labelled as a dry run.
#
#   bash benchmarks/device_check.sh                 # on a machine with a CUDA device
#   DRY_RUN=1 OUT=dry-out bash benchmarks/device_check.sh
set -uo pipefail
PY=${PYTHON:-python3}
export OUT=${OUT:-device-out} NANOGPT=${NANOGPT:-.nanogpt}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 470 "$PY" benchmarks/device_check.py 2>&1 | tee "$OUT/device_check.log"
exit "${PIPESTATUS[0]}"
