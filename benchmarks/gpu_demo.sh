#!/usr/bin/env bash
# The built-in demo on one GPU: builds the demo policy (SFT) and runs GRPO, then a
# GRPO run on the CPU of the same machine for comparison. Writes logs and metrics to
# $OUT (default ./gpu-demo-out). Run from the repository root.
set -euo pipefail
OUT=${OUT:-gpu-demo-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . \
  $(for d in plugins/*/*/; do echo "-e $d"; done) 2>&1 | grep -v WARNING || true
export RLX_CACHE=$(mktemp -d) PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
run() {  # name, extra args...
  local name=$1; shift
  local start=$SECONDS
  rlx train --algo grpo --output "$RLX_CACHE/$name" --set logging.progress=false "$@" 2>&1 \
    | grep -E "accuracy|making|done|Error" | tee "$OUT/$name.log"
  echo "$name wall_s $((SECONDS - start))" | tee -a "$OUT/times.txt"
  cp "$RLX_CACHE/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl"
}
run gpu_first_run              # includes the one-off SFT of the demo policy
run gpu_cached                 # demo policy cached
run cpu_cached --set training.device=cpu
