#!/usr/bin/env bash
# One device call of the 2026-11-27 session (issue 34): where the remaining time and memory gaps go, measured by
# memplan's own cuda probes with MEMPLAN_PROFILE=1 (one more step, each phase under torch.profiler:
# probes/step/profile.py) and the allocator's history (on by default in cuda probes). Run from the repository
# root on the lent GPU with carry [".whl"]. Cases in order of what they decide, each only while the call's
# budget has room: opt-1.3b ZeRO-3 + CPU optimizer offload + ckpt (mb 8 x 1024), opt-1.3b PPO with
# empty_cache never (the H100 record's request), gemma-3-1b ZeRO-2 mb 4 x 1024 (262k vocabulary, sliding
# window), opt-1.3b ZeRO-0 mb 8 x 1024 without ckpt, qwen2.5-1.5b ZeRO-2 mb 4 x 1024. Everything goes back as
# $OUT/session.tgz (a call returns at most 8 files): device.txt, log.txt, probes.db, probes.json, *.err.
set -u
start=$(date +%s)
budget=${BUDGET_S:-470}
left() { echo $(( budget - ($(date +%s) - start) )); }
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/log.txt"; }
pack() { tar czf /tmp/session.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/session.tgz "$OUT/session.tgz"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD DS_ACCELERATOR=cuda TORCH_CUDA_ARCH_LIST=9.0 MEMPLAN_PROFILE=1
log "installed"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
  python3 -c "import torch, deepspeed, transformers, os; p=torch.cuda.get_device_properties(0); print(p.name, p.total_memory, f'cc {p.major}.{p.minor}', 'sms', p.multi_processor_count, 'torch', torch.__version__, 'cuda', torch.version.cuda, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__, 'cpus', os.cpu_count())"
  free -g | head -2; } > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
mkdir -p /tmp/cases
common='"lora_rank": 0, "grad_accum": 1, "allocator": "default", "offload_param": "none"'
echo "[{\"zero_stage\": 3, \"offload_optimizer\": \"cpu\", \"gradient_checkpointing\": true, \"micro_batch\": 8, \"empty_cache\": \"never\", $common}]" > /tmp/cases/z3off.json
echo "[{\"zero_stage\": 2, \"offload_optimizer\": \"none\", \"gradient_checkpointing\": false, \"micro_batch\": 4, \"empty_cache\": \"never\", $common}]" > /tmp/cases/z2mb4.json
echo "[{\"zero_stage\": 0, \"offload_optimizer\": \"none\", \"gradient_checkpointing\": false, \"micro_batch\": 8, \"empty_cache\": \"never\", $common}]" > /tmp/cases/z0mb8.json
trained='{"zero_stage": 2, "offload_optimizer": "none", "offload_param": "none", "gradient_checkpointing": true, "lora_rank": 0}'
echo "[{\"actor\": $trained, \"critic\": $trained, \"reference\": {\"zero_stage\": 0, \"offload\": \"none\"}, \"reward\": {\"zero_stage\": 0, \"offload\": \"none\"}, \"hybrid_engine\": true, \"ema\": false, \"generation_batch\": 4, \"micro_batch\": 4, \"grad_accum\": 1, \"empty_cache\": \"never\", \"allocator\": \"default\"}]" > /tmp/cases/ppo_never.json
# DeepSpeed's JIT ops, both at once, before anything is timed
python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()" > "$OUT/build_fused.txt" 2>&1 &
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$OUT/build_cpuadam.txt" 2>&1 &
wait
log "ops built: $(tail -c 150 "$OUT/build_fused.txt" | tr '\n' ' ') | $(tail -c 150 "$OUT/build_cpuadam.txt" | tr '\n' ' ')"
probe() {  # NAME NEED_S TIMEOUT_S args...: one planner probe, if the budget still has room for it
  local name=$1 need=$2 timeout=$3; shift 3
  if [ "$(left)" -lt "$need" ]; then log "skip $name (budget $(left) s)"; return; fi
  python3 -m planner probe --device cuda --timeout "$timeout" --db "$OUT/probes.db" --json "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.err"
  log "$name rc $?"; tail -3 "$OUT/$name.err"
}
probe z3off 110 150 --model opt-1.3b --workload sft --batch 8 --seq-len 1024 --steps 5 --strategies /tmp/cases/z3off.json
probe ppo_never 100 150 --model opt-1.3b --workload ppo --batch 4 --prompt-len 256 --gen-len 256 --steps 3 --strategies /tmp/cases/ppo_never.json
probe gemma 70 110 --model gemma-3-1b --workload sft --batch 4 --seq-len 1024 --steps 4 --strategies /tmp/cases/z2mb4.json
probe z0mb8 60 90 --model opt-1.3b --workload sft --batch 8 --seq-len 1024 --steps 4 --strategies /tmp/cases/z0mb8.json
probe qwen 60 90 --model qwen2.5-1.5b --workload sft --batch 4 --seq-len 1024 --steps 4 --strategies /tmp/cases/z2mb4.json
python3 -m planner probes --db "$OUT/probes.db" --json -n 50 > "$OUT/probes.json" 2> "$OUT/probes.err"
log "done"
python3 - <<'PY'
import json, os
for probe in json.load(open(os.environ["OUT"] + "/probes.json")):
    res = probe["result"]; ex = res.get("extra", {})
    print(probe["request"]["workload"]["model"], res["outcome"], res.get("message", "")[:120], ex.get("step_time_s", {}).get("median"))
    for ph in res.get("phases", []):
        print(f"  {ph['name']:16s} alloc {ph['peak_allocated_bytes']/2**30:7.2f} res {ph['peak_reserved_bytes']/2**30:7.2f} t {ph['time_s']:.4f}")
    for name, p in ex.get("profile", {}).items():
        kinds = {k: round(v * 1e3, 1) for k, v in p.get("device_s_by_kind", {}).items()}
        print(f"  prof {name:12s} wall {p['wall_s']*1e3:8.1f} ms active {p.get('device_active_s', 0)*1e3:8.1f} busy {p.get('device_busy_s', 0)*1e3:8.1f} kernels {p.get('kernels')} {kinds}")
PY
pack
