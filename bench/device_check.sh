#!/bin/bash
# The checks a lent GPU machine is for, in one call (about 8 minutes on an H100). Here, first: `sh bench/carry.sh
# prepare`; then the device tool's run with carry [".whl", ".carry"] and the command `bash bench/device_check.sh`.
# Each step writes what it measured under $OUT; bench/results/bubbles.md says what the figures answer.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
. bench/carry.sh install > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
T0=$(date +%s)
step() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }

step "does importing torch._dynamo start CUDA? (a fork server could then preload it)"
python3 - <<'PY' 2>&1 | tee "$OUT/dynamo_fork.txt"
import multiprocessing, torch, torch._dynamo
def child(q):
    try:
        q.put(float(torch.ones(2, device="cuda").sum()))
    except Exception as err:
        q.put(f"{type(err).__name__}: {err}")
ctx = multiprocessing.get_context("fork")
q = ctx.Queue()
p = ctx.Process(target=child, args=(q,)); p.start(); print("a forked child's CUDA after torch._dynamo:", q.get()); p.join()
PY

step "the fill executor's tests on the GPU (the fill job's state off the stage's GPU; the fork server under CUDA)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fill_executor.py 2>&1 | tail -4 | tee "$OUT/tests.txt"

step "stage 2 through the Filler (no broker), then live, on the same card"
timeout 150 python3 bench/bubbles.py --device cuda --stage 2 --steps 24 --fill-steps 140 --json \
    > "$OUT/bubbles_stage2_filler.json" 2> "$OUT/filler.log"; echo "rc=$?"
timeout 200 python3 bench/bubbles.py --device cuda --live --stage 2 --steps 24 --fill-steps 140 --json \
    > "$OUT/bubbles_stage2_live.json" 2> "$OUT/live.log"; echo "rc=$?"

step "fill configurations (the H100 run of 2026-11-26's command)"
timeout 170 python3 bench/fill_configurations.py --device cuda --width 4096 --depth 5 --batch 4096 --free-gb 2 \
    --json > "$OUT/fill_configurations.json" 2> "$OUT/fill.log"; echo "rc=$?"
step "done"
