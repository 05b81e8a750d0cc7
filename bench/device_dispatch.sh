#!/bin/bash
# Issue 23's figure on a lent machine's 16 cores (its GPU unused; about 6 minutes): p99 at 1,000 submits/s with 100
# agents, each row with the fsync at every write (`always`, the embedded default) and without (`everysec`), on one
# redis-server and on a 3-node cluster. Here, first: `sh bench/carry.sh prepare`; then the device tool's run with
# carry [".whl", ".carry"] and the command `bash bench/device_dispatch.sh`. bench/results/dispatch.md says what the
# `*_cpu_ms_per_job` and `cycle_*` keys answer.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/device-dispatch}
mkdir -p "$OUT"
. bench/carry.sh install > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nproc | tee "$OUT/cores.txt"
T0=$(date +%s)
for fsync in always everysec; do
    for layout in "--cluster-nodes 0 --shards 1 --replicas 1" "--cluster-nodes 3 --shards 6 --replicas 6"; do
        echo "== $layout --fsync $fsync ($(( $(date +%s) - T0 )) s)"
        # shellcheck disable=SC2086
        timeout 80 python3 bench/dispatch.py --agents 100 --jobs 4000 --rate 1000 --timeout 50 --hosts 8 \
            --submitters 4 $layout --fsync "$fsync" --json 2>> "$OUT/dispatch.log" | tee -a "$OUT/dispatch.jsonl"
    done
done
echo "== done ($(( $(date +%s) - T0 )) s)"
