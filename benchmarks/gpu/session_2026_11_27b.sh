#!/usr/bin/env bash
# The second device call of the 2026-11-27 session (issue 34), on a fresh machine with carry [".whl"]: ZeRO-3 at a
# third size and ZeRO-3 with parameters and optimizer on the host, by memplan's cuda probes with MEMPLAN_PROFILE=1.
# Cases, each only while the budget has room: opt-1.3b ZeRO-3 + parameter and optimizer offload + ckpt
# (mb 8 x 1024), llama-3.2-3b ZeRO-3 + ckpt and ZeRO-2 + ckpt (mb 8 x 1024). Results: $OUT/session.tgz.
set -u
start=$(date +%s)
budget=${BUDGET_S:-215}
left() { echo $(( budget - ($(date +%s) - start) )); }
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/log.txt"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD DS_ACCELERATOR=cuda TORCH_CUDA_ARCH_LIST=9.0 MEMPLAN_PROFILE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1
mkdir -p /tmp/cases
common='"lora_rank": 0, "grad_accum": 1, "allocator": "default", "gradient_checkpointing": true, "micro_batch": 8, "empty_cache": "never"'
echo "[{\"zero_stage\": 3, \"offload_optimizer\": \"cpu\", \"offload_param\": \"cpu\", $common}]" > /tmp/cases/z3inf.json
echo "[{\"zero_stage\": 3, \"offload_optimizer\": \"none\", \"offload_param\": \"none\", $common}, {\"zero_stage\": 2, \"offload_optimizer\": \"none\", \"offload_param\": \"none\", $common}]" > /tmp/cases/z3z2.json
python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()" > "$OUT/build_fused.txt" 2>&1 &
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$OUT/build_cpuadam.txt" 2>&1 &
wait
log "ops built"
probe() {  # NAME NEED_S TIMEOUT_S args...
  local name=$1 need=$2 timeout=$3; shift 3
  if [ "$(left)" -lt "$need" ]; then log "skip $name (budget $(left) s)"; return; fi
  python3 -m planner probe --device cuda --timeout "$timeout" --db "$OUT/probes.db" --json "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.err"
  log "$name rc $?"; tail -n 2 "$OUT/$name.err"
}
probe z3inf 70 90 --model opt-1.3b --workload sft --batch 8 --seq-len 1024 --steps 5 --strategies /tmp/cases/z3inf.json
probe llama3b 70 60 --model llama-3.2-3b --workload sft --batch 8 --seq-len 1024 --steps 5 --strategies /tmp/cases/z3z2.json
python3 -m planner probes --db "$OUT/probes.db" --json -n 50 > "$OUT/probes.json" 2> "$OUT/probes.err"
log "done"
python3 - <<'PY'
import json, os
for probe in json.load(open(os.environ["OUT"] + "/probes.json")):
    res = probe["result"]; ex = res.get("extra", {})
    print(probe["request"]["workload"]["model"], probe["request"]["strategy"].get("zero_stage"), res["outcome"], res.get("message", "")[:100], ex.get("step_time_s", {}).get("median"))
    for ph in res.get("phases", []):
        print(f"  {ph['name']:16s} alloc {ph['peak_allocated_bytes']/2**30:7.2f} res {ph['peak_reserved_bytes']/2**30:7.2f} t {ph['time_s']:.4f}")
PY
tar czf /tmp/session.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/session.tgz "$OUT/session.tgz"
