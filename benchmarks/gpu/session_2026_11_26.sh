#!/usr/bin/env bash
# One device call of the 2026-11-26 session (issues 33 and 34), run from the repository root on the lent GPU
# with carry [".whl", ".gpu_run"]; .gpu_run holds ../shared/gpu/measure_sft.py and what
# benchmarks/gpu/zero3_cases.py writes (the cases and program_strategies.json). Results go under $OUT as they come:
# device.txt (fingerprint), zero/ (measure_sft.py rows), builtin.json and program.json (planner probe --json),
# probes.db (the probe rows), packed into $OUT/session.tgz at the end. A case starts only while the call is under
# its time budget.
set -u
start=$(date +%s)
budget=${BUDGET_S:-500}
left() { echo $(( budget - ($(date +%s) - start) )); }
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/log.txt"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD DS_ACCELERATOR=cuda TORCH_CUDA_ARCH_LIST=9.0
log "installed"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
  python3 -c "import torch, deepspeed, transformers, peft, os; p=torch.cuda.get_device_properties(0); print(p.name, p.total_memory, f'cc {p.major}.{p.minor}', 'sms', p.multi_processor_count, 'torch', torch.__version__, 'cuda', torch.version.cuda, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'cpus', os.cpu_count())"
  free -g | head -2; } > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
# DeepSpeed's JIT ops, both at once, before anything is timed
python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()" > "$OUT/build_fused.txt" 2>&1 &
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" > "$OUT/build_cpuadam.txt" 2>&1 &
wait
log "ops built: $(tail -c 200 "$OUT/build_fused.txt" | tr '\n' ' ') | $(tail -c 200 "$OUT/build_cpuadam.txt" | tr '\n' ' ')"
run_zero() {  # one measure_sft.py case, if the budget still has room for it
  if [ "$(left)" -lt "$2" ]; then log "skip $1 (budget)"; return; fi
  python3 .gpu_run/measure_sft.py .gpu_run/zero_cases.json "$OUT/zero" "$1" 2>&1 | tail -12 | tee -a "$OUT/log.txt"
  mv "$OUT/zero/results.json" "$OUT/zero/results-$1.json" 2>/dev/null
}
run_zero opt13_z3ck_mb8_s1024 60
run_zero opt13_z3ckoff_mb8_s1024 90
run_zero opt13_z2ck_mb8_s1024 60
probe=(python3 -m planner probe --model opt-1.3b --workload sft --batch 8 --seq-len 1024 --device cuda --steps 6
       --timeout 150 --strategies .gpu_run/program_strategies.json --db "$OUT/probes.db" --json)
if [ "$(left)" -gt 150 ]; then
  "${probe[@]}" > "$OUT/builtin.json" 2> "$OUT/builtin.err"; log "builtin probe rc $?"; tail -5 "$OUT/builtin.err"
fi
if [ "$(left)" -gt 120 ]; then
  "${probe[@]}" -- python3 .gpu_run/measure_sft.py .gpu_run/program_case.json "$OUT/program_runs" \
    > "$OUT/program.json" 2> "$OUT/program.err"; log "program probe rc $?"; tail -5 "$OUT/program.err"
fi
run_zero opt27_z3ck_mb8_s1024 70
run_zero opt27_z2ck_mb8_s1024 70
run_zero opt27_z3ckoff_mb8_s1024 120
log "done"
python3 - <<'PY'
import glob, json
for path in sorted(glob.glob(__import__("os").environ["OUT"] + "/zero/*.json")):
    if "results" in path: continue
    r = json.load(open(path)); g = 2**30
    print(f"{r['name']:26s} res {r['peak_reserved_all']/g:6.2f} alloc {r['peak_allocated_all']/g:6.2f} steps", [round(t, 3) for t in r['step_s']])
PY
# A call brings back at most 8 files from $OUT (the first call of 2026-11-26 lost its per-case files that way):
# everything goes back as one archive.
tar czf /tmp/session.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/session.tgz "$OUT/session.tgz"
