#!/bin/bash
# The demo's set-up time on a fresh clone: `git clone` of BRANCH from REPO into a new temporary directory, then
# `make demo` there with an empty HOME (an empty pip cache and token cache), timed from `make demo` until the first
# run writes its first metrics record (training has started). The demo is then stopped (SIGTERM to its process
# group) and the clone removed. pip installs from whatever index and wheel directories its configuration names.
#   bash benchmarks/demo_setup.sh [REPO [BRANCH]]        (default: this checkout, its current branch)
set -u
repo=${1:-$(git rev-parse --show-toplevel)}
branch=${2:-$(git -C "$repo" rev-parse --abbrev-ref HEAD)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/home"
git clone -q --branch "$branch" "$repo" "$work/clone"
cd "$work/clone"
t0=$(date +%s.%N)
HOME="$work/home" setsid make demo > "$work/demo.log" 2>&1 &
pid=$!
result="make exited before training started"
while kill -0 "$pid" 2>/dev/null; do
  f=$(ls runs/demo-quick-*/runs/*/metrics.jsonl 2>/dev/null | head -1)
  if [ -n "$f" ] && [ -s "$f" ]; then
    result=$(python3 -c "import sys; print(f'training started {float(sys.argv[1]) - float(sys.argv[2]):.0f} s after make demo')" "$(date +%s.%N)" "$t0")
    break
  fi
  sleep 1
done
kill -TERM -- "-$pid" 2>/dev/null; sleep 10; kill -KILL -- "-$pid" 2>/dev/null
echo "$result"
echo ".venv: $(du -sh .venv | cut -f1), $(.venv/bin/python -m pip list 2>/dev/null | tail -n +3 | wc -l) packages;" \
     "load average $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
grep -v '^\[' "$work/demo.log" | head -20
