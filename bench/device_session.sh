#!/usr/bin/env bash
# Runs GPU measurements and GPU tests in one go on a CUDA machine, each step bounded by its own
# time limit so that one failure or hang costs that step only. Logs go to $OUT (default
# ./outputs/device), and the tables are printed together at the end.
#
#   bash bench/device_session.sh env gpu_tests verifier            # one call
#   bash bench/device_session.sh gpu_suites_process                # the suites under process isolation
#   bash bench/device_session.sh cpu_suites                        # verdicts on CPU with the image's Triton
#   bash bench/device_session.sh timing                            # another
#   bash bench/device_session.sh value_reach                       # scale_up's reach per problem
#   bash bench/device_session.sh rollout sft
#   bash bench/device_session.sh multi_gpu                         # on a machine with >= 2 GPUs
#   bash bench/device_session.sh rehearsal                         # 7B rehearsal on every GPU (~7 min)
#   bash bench/device_session.sh rl_algorithms                     # on a machine with >= 2 GPUs
#   SYNTH_COUNT=3000 SYNTH_MINUTES=8 bash bench/device_session.sh synthesize   # pairs built by inductor
#
# rehearsal: USD_PER_GPU_HOUR (default 2.5) prices the projection; REHEARSAL_ARGS adds flags
# (e.g. "--config configs/a100-40gb.yaml").
#
# KernelBench is read from KERNELBENCH (default: ../shared/kernelbench/..., else .carry/kernelbench/...).
# A bubblewrap binary in .carry/bin is put on PATH when the machine has none.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
command -v bwrap >/dev/null 2>&1 || { [ -x .carry/bin/bwrap ] && export PATH="$PWD/.carry/bin:$PATH"; }
PY=${PYTHON:-python3}
for candidate in ../shared/kernelbench/kernelbench_problems.jsonl .carry/kernelbench/kernelbench_problems.jsonl; do
  [ -f "$candidate" ] && KERNELBENCH=${KERNELBENCH:-$candidate}
done
KERNELBENCH=${KERNELBENCH:-missing}

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "=== $name (limit ${limit}s)"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start))s"
  echo "$name exit=$rc seconds=$((SECONDS - start))" >>"$OUT/summary.txt"
}

run_env() {
  step env 60 bash -c "nvidia-smi -L; $PY -c 'import torch, triton, transformers, peft, accelerate; \
print(torch.__version__, triton.__version__, transformers.__version__, peft.__version__, accelerate.__version__); \
print(torch.cuda.get_device_name(0), torch.cuda.device_count())'; bwrap --version; \
bwrap --ro-bind / / --dev /dev --proc /proc --unshare-net true && echo bwrap-works"
}

run_gpu_marked() {
  step gpu_tests 420 env KERNELBENCH_JSONL="$KERNELBENCH" "$PY" -m pytest -q -x -m gpu tests/verify/test_timing_gpu.py tests/verify/test_verify_funnel.py tests/verify/test_runtime_audit.py tests/verify/test_sandbox.py tests/verify/test_triton_cache.py tests/generation/test_decoding.py -p no:cacheprovider
}

run_gpu_suites() {  # run_gpu_suites ISOLATION (auto: bubblewrap, or process): the adversarial and correct suites on CUDA
  local isolation=$1
  step "gpu_suites_$isolation" 540 env KERNEL_RL_TEST_DEVICE=cuda KERNEL_RL_TEST_ISOLATION="$isolation" KERNELBENCH_JSONL="$KERNELBENCH" \
    "$PY" -m pytest -q tests/verify/test_kernelbench_solutions.py tests/verify/test_adversarial.py \
    tests/verify/test_judged_context.py -p no:cacheprovider
}

run_gpu_tests() {
  run_gpu_marked
  run_gpu_suites auto
}

run_cpu_suites() {  # verdicts judged on CPU with this machine's Triton and NumPy (the interpreter's patches)
  step cpu_suites 540 env KERNEL_RL_TEST_DEVICE=cpu KERNELBENCH_JSONL="$KERNELBENCH" \
    "$PY" -m pytest -q tests/verify/test_interpreter_gaps.py tests/verify/test_tensor_descriptors.py \
    tests/verify/test_triton_cache.py tests/verify/test_kernelbench_solutions.py -p no:cacheprovider
}

run_verifier() {
  step verifier_throughput 540 "$PY" bench/verifier_throughput.py --kernelbench "$KERNELBENCH" --device cuda --copies 2
}

run_synthesize() {  # verified PyTorch -> Triton pairs built by inductor (SYNTH_COUNT programs, SYNTH_MINUTES at most)
  step synthesize $(( ${SYNTH_MINUTES:-8} * 60 + 90 )) env JAX_PLATFORMS=cpu "$PY" -m extensions.data.synthesis \
    --out "$OUT/synthesized_pairs.jsonl" --count "${SYNTH_COUNT:-3000}" --eval-tasks "$KERNELBENCH" \
    --max-minutes "${SYNTH_MINUTES:-8}" --no-progress ${SYNTH_ARGS:-}
  tail -n 30 "$OUT/synthesize.log"
}

run_value_reach() {  # how far scale_up reaches per problem on CUDA, full sizes
  step value_set_reach 300 "$PY" bench/value_set_reach.py --kernelbench "$KERNELBENCH" --device cuda --levels 1 2 3 --max-minutes 4
}

run_timing() {
  step timing_accuracy 380 "$PY" bench/timing_accuracy.py --kernelbench "$KERNELBENCH" --out "$OUT/timing_accuracy.md" --max-minutes 5
}

run_rollout() {
  step rollout_throughput 330 "$PY" bench/rollout_throughput.py
}

run_sft() {
  step sft_throughput 330 "$PY" bench/sft_throughput.py
}

run_multi_gpu() {
  local root=/tmp/kernel-rl-multi
  rm -rf "$root"
  step multi_gpu_prepare 120 bash -c "$PY -c 'from extensions.models.tiny import save_tiny_model; save_tiny_model(\"$root/model\", hidden_size=256, num_layers=4)' \
    && $PY prepare_data.py --smoke --set run.root=$root/ddp --no-progress"
  local common=(--smoke --set "model.name_or_path=$root/model" --set model.gguf_file=null --set model.dtype=bfloat16
                --set verifier.device=cuda --set rl.max_new_tokens=64 --set eval.max_new_tokens=64
                --set sft.max_seq_len=4096 --set sft.max_steps=4 --set sft.save_every_steps=2)
  step multi_gpu_ddp 240 "$PY" -m accelerate.commands.launch --num_processes 2 --mixed_precision no \
    train_integrated.py --stage all "${common[@]}" --set "run.root=$root/ddp"
  step multi_gpu_device_map 150 bash -c "cp -r $root/ddp/data $root/devmap-data && mkdir -p $root/devmap && mv $root/devmap-data $root/devmap/data \
    && $PY train_integrated.py --stage sft ${common[*]} --set run.root=$root/devmap --set model.device_map=auto"
  find "$root" -maxdepth 4 -name meta.json -path '*final*' -exec sh -c 'echo "--- $1"; cat "$1"' _ {} \; >"$OUT/multi_gpu_checkpoints.txt" 2>&1
}

run_rl_algorithms() {
  # One data-parallel `--stage rl` round each of best_of_n, grpo and rloo on the same tasks (same
  # data, seed and curriculum), then the policy-gradient update under DDP with a reward that has
  # spread (random weights score 0 on every kernel, so the verifier's rounds leave GRPO/RLOO flat).
  local root=/tmp/kernel-rl-algorithms
  rm -rf "$root"
  step rl_algorithms_prepare 120 bash -c "$PY -c 'from extensions.models.tiny import save_tiny_model; save_tiny_model(\"$root/model\", hidden_size=256, num_layers=4)' \
    && $PY prepare_data.py --smoke --set run.root=$root/data --no-progress"
  local common=(--smoke --set "model.name_or_path=$root/model" --set model.gguf_file=null --set model.dtype=bfloat16
                --set verifier.device=cuda --set rl.num_rounds=1 --set rl.tasks_per_round=4 --set rl.samples_per_task=8
                --set rl.max_new_tokens=128 --set rl.generation_batch_size=16 --set rl.per_device_batch_size=4
                --set rl.init=base)
  local algorithm
  for algorithm in best_of_n grpo rloo; do
    mkdir -p "$root/$algorithm" && cp -r "$root/data/data" "$root/$algorithm/data"
    step "rl_round_$algorithm" 300 "$PY" -m accelerate.commands.launch --num_processes 2 --mixed_precision no \
      train_integrated.py --stage rl --no-progress "${common[@]}" --set "run.root=$root/$algorithm" --set "rl.algorithm=$algorithm"
  done
  for algorithm in grpo rloo; do
    step "rl_synthetic_$algorithm" 300 "$PY" -m accelerate.commands.launch --num_processes 2 --mixed_precision no \
      tests/rl_synthetic.py "$root/synthetic-$algorithm" "$root/model" --set "rl.algorithm=$algorithm" --set rl.num_rounds=3
  done
  "$PY" - "$root" >"$OUT/rl_algorithms.md" 2>&1 <<'PYEOF'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
print("| run | algorithm | round | reward mean | zero-spread groups | update steps | sampling s | verifying s | training s | round s |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for run in ["best_of_n", "grpo", "rloo", "synthetic-grpo", "synthetic-rloo"]:
    log = root / run / "logs" / "rl_metrics.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    for r in (r for r in rows if r["kind"] == "round"):
        s = r["seconds"]
        print(f"| {run} | {r['algorithm']} | {r['round']} | {r['reward_mean']:.3f} | {r.get('zero_spread_groups')}/{r.get('groups')} "
              f"| {r.get('train_steps')} | {s['sampling_s']:.1f} | {s['verifying_s']:.1f} | {s['training_s']:.1f} | {s['round_s']:.1f} |")
    if not rows:
        print(f"| {run} | - | no metrics (see its log) | | | | | | | |")
PYEOF
  cat "$OUT/rl_algorithms.md"
}

run_rehearsal() {
  local gpus launch=("$PY")
  gpus=$(nvidia-smi -L | wc -l)
  [ "$gpus" -gt 1 ] && launch=("$PY" -m accelerate.commands.launch --num_processes "$gpus" --mixed_precision no)
  # shellcheck disable=SC2086  # REHEARSAL_ARGS is a list of flags
  step rehearsal 540 "${launch[@]}" bench/production_rehearsal.py --kernelbench "$KERNELBENCH" \
    --usd-per-gpu-hour "${USD_PER_GPU_HOUR:-2.5}" --out "$OUT/rehearsal" --no-progress ${REHEARSAL_ARGS:-}
}

for name in "$@"; do
  case "$name" in
    env) run_env ;; gpu_tests) run_gpu_tests ;; gpu_marked) run_gpu_marked ;;
    gpu_suites) run_gpu_suites auto ;; gpu_suites_process) run_gpu_suites process ;; cpu_suites) run_cpu_suites ;;
    verifier) run_verifier ;; value_reach) run_value_reach ;; timing) run_timing ;;
    rollout) run_rollout ;; sft) run_sft ;; multi_gpu) run_multi_gpu ;; rehearsal) run_rehearsal ;;
    rl_algorithms) run_rl_algorithms ;; synthesize) run_synthesize ;;
    *) echo "unknown step $name" >&2; exit 2 ;;
  esac
done

echo; echo "##### summary"; cat "$OUT/summary.txt"
for log in "$OUT"/*.log; do
  echo; echo "##### $(basename "$log") (tail)"
  tail -n 40 "$log"
done
