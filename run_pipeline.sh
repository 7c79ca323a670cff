#!/usr/bin/env bash
# The whole pipeline, resumable: prepare -> SFT -> RL -> evaluate --compare.
#
#   ./run_pipeline.sh --smoke                                   # CPU run (Qwen2.5-Coder-0.5B GGUF, bundled data)
#   ./run_pipeline.sh --config configs/default.yaml --bucket B  # 8-GPU spot run, mirrored to S3
#   ./run_pipeline.sh --smoke --set rl.num_rounds=1             # any config override, repeatable
#   ./run_pipeline.sh --smoke --force                           # retrain stages made with other settings
#
# Each stage is skipped when its complete output exists and was made with this run's settings
# (prepare: prepare_report.json matches the data inputs; sft, rl: a complete final/ whose meta.json
# records the same stage-deciding config keys and input hashes; eval: compare.json of the current
# adapters and eval settings), so running the same command again after any interruption continues
# where it stopped; the training stage resumes from its newest complete checkpoint by itself. A
# training result made with other settings stops the pipeline with the keys that differ: --force
# retrains those stages (and what follows them), or the config they were made with keeps them.
# One pipeline at a time per run directory (a run lock; a second one stops naming the holder).
#
# With --bucket (or $KERNEL_RL_BUCKET, or checkpoint.bucket) the run is restored from
# s3://BUCKET/PREFIX/RUN_ID/ before starting, and `checkpoint_manager.py --action watch` runs beside
# the stages: a sync every checkpoint.sync_interval_s, spot notices answered with a checkpoint and an
# emergency sync, and a final sync when the pipeline ends (also after a failed stage). Without a
# bucket the watcher still turns a spot notice into a checkpoint.
#
# Without --config or --smoke: configs/default.yaml when a CUDA GPU is visible, else the smoke config
# (the same choice every stage script makes: extensions/config/machine.py).
# Training runs under `accelerate launch --num_processes N` when N > 1 GPUs are visible (N counts the
# entries of CUDA_VISIBLE_DEVICES when it is set, else the GPUs `nvidia-smi -L` lists), and as one
# process when model.device_map is set (it shards one model over every visible GPU).
# Environment: PYTHON (interpreter, default python3), KERNEL_RL_BUCKET, KERNEL_RL_TRAIN_LAUNCHER
# (replaces the training launcher, e.g. "accelerate launch --num_processes 4").
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"

# The comment block at the top of this file, up to its first line that is not a comment.
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

CONFIG=""
SMOKE=0
FORCE=0
BUCKET="${KERNEL_RL_BUCKET:-}"
SETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) [ $# -ge 2 ] || { echo "--config needs a file" >&2; exit 2; }; CONFIG="$2"; shift 2 ;;
    --config=*) CONFIG="${1#*=}"; shift ;;
    --smoke) SMOKE=1; shift ;;
    --force) FORCE=1; shift ;;
    --bucket) [ $# -ge 2 ] || { echo "--bucket needs a name" >&2; exit 2; }; BUCKET="$2"; shift 2 ;;
    --bucket=*) BUCKET="${1#*=}"; shift ;;
    --set) [ $# -ge 2 ] || { echo "--set needs section.key=value" >&2; exit 2; }; SETS+=(--set "$2"); shift 2 ;;
    --set=*) SETS+=(--set "${1#*=}"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_pipeline.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

log() { printf '[pipeline %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
banner() { printf '\n======== %s ========\n' "$*"; }

if [ -n "$CONFIG" ] && [ "$SMOKE" = 1 ]; then
  echo "run_pipeline.sh: give --config or --smoke, not both" >&2; exit 2
fi
if [ -n "$CONFIG" ]; then
  [ -f "$CONFIG" ] || { echo "run_pipeline.sh: config file not found: $CONFIG" >&2; exit 2; }
  CONFIG="$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")"
elif [ "$SMOKE" = 1 ]; then
  CONFIG="$HERE/configs/smoke.yaml"
fi
# Without a config named, `python -m extensions.pipeline state` reports the one the machine calls for
# (CONFIG_FILE); every stage is then given that file, so all of them read the same run.
CFG_ARGS=(${CONFIG:+--config "$CONFIG"} ${SETS[@]+"${SETS[@]}"})
FORCE_ARGS=()
[ "$FORCE" = 1 ] && FORCE_ARGS=(--force)
BUCKET_ARGS=()
[ -n "$BUCKET" ] && BUCKET_ARGS=(--bucket "$BUCKET")
cd "$HERE"

# Installs nothing: only checks, and says what to run.
if ! "$PY" - <<'EOF'
import importlib.util, sys
needed = ["yaml", "torch", "triton", "transformers", "peft", "accelerate", "boto3", "tqdm"]
missing = [name for name in needed if importlib.util.find_spec(name) is None]
if missing:
    print(f"run_pipeline.sh: missing Python packages: {', '.join(missing)}; run ./setup.sh first", file=sys.stderr)
    sys.exit(1)
EOF
then exit 1; fi

# Where the run lives (and, without --config, the config the machine calls for), from the pipeline
# package; it fails (exit 2, with the keys that differ) when a saved training result was made with
# other settings and --force was not given.
read_location() {
  local assignments
  assignments="$("$PY" -m extensions.pipeline state "${CFG_ARGS[@]}" ${BUCKET_ARGS[@]+"${BUCKET_ARGS[@]}"} \
    ${FORCE_ARGS[@]+"${FORCE_ARGS[@]}"})" || return $?
  eval "$assignments"
}
read_location || exit $?
if [ -z "$CONFIG" ]; then
  CONFIG="$CONFIG_FILE"
  CFG_ARGS=(--config "$CONFIG" ${SETS[@]+"${SETS[@]}"})
  log "no --config given: $CONFIG ($CONFIG_REASON)"
fi

RUNNER_PID=""
WATCH_PID=""

start_watch() {
  mkdir -p "$LOGS_DIR"
  "$PY" "$HERE/checkpoint_manager.py" --action watch --exit-with-parent "${CFG_ARGS[@]}" ${BUCKET_ARGS[@]+"${BUCKET_ARGS[@]}"} \
    >>"$LOGS_DIR/checkpoint_manager.log" 2>&1 &
  WATCH_PID=$!
  log "checkpoint watcher running (pid $WATCH_PID, log $LOGS_DIR/checkpoint_manager.log)"
}

stop_watch() {
  [ -n "$WATCH_PID" ] || return 0
  local rc=0
  if kill -0 "$WATCH_PID" 2>/dev/null; then
    [ -n "$BUCKET" ] && log "final S3 sync to $S3_URI ..."
    # A background job starts with SIGINT ignored until the watcher installs its handler, so a
    # SIGINT sent in its first second would be lost: repeat it (harmless once it is stopping).
    local tries=0
    while kill -0 "$WATCH_PID" 2>/dev/null && [ "$tries" -lt 30 ]; do
      kill -INT "$WATCH_PID" 2>/dev/null || true
      sleep 1 & wait $! 2>/dev/null || true
      tries=$((tries + 1))
    done
    wait "$WATCH_PID" || rc=$?
  else
    wait "$WATCH_PID" 2>/dev/null || rc=$?
  fi
  WATCH_PID=""
  if [ -n "$BUCKET" ]; then
    if [ "$rc" = 0 ]; then log "final S3 sync done"; else log "final S3 sync incomplete (exit $rc): see $LOGS_DIR/checkpoint_manager.log; run 'python checkpoint_manager.py --action sync ${CFG_ARGS[*]} --bucket $BUCKET'"; fi
  fi
}

on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$RUNNER_PID" ] && kill -0 "$RUNNER_PID" 2>/dev/null; then
    kill -TERM "$RUNNER_PID" 2>/dev/null || true
    wait "$RUNNER_PID" 2>/dev/null || true
  fi
  stop_watch
  [ -n "${LOCK_TOKEN:-}" ] && "$PY" -m extensions.runtime.run_lock release "$RUN_ROOT" --token "$LOCK_TOKEN" || true
  exit "$rc"
}

# The pipeline runner asks the running stage to save and stop, and closes with its summary.
on_signal() {
  local name=$1
  log "received SIG$name: asking the running stage to save and stop"
  if [ -n "$RUNNER_PID" ] && kill -0 "$RUNNER_PID" 2>/dev/null; then
    kill "-$name" "$RUNNER_PID" 2>/dev/null || true
    wait "$RUNNER_PID" 2>/dev/null || true
  else
    echo "  INTERRUPTED: pipeline (SIG$name); run the same command again to continue from the last checkpoint"
  fi
  RUNNER_PID=""
  exit 130
}

# The run lock, held for this shell; the stages and the restore share it through KERNEL_RL_RUN_LOCK.
LOCK_TOKEN="$("$PY" -m extensions.runtime.run_lock acquire "$RUN_ROOT" --pid $$)" || exit 73
export KERNEL_RL_RUN_LOCK="$LOCK_TOKEN"

trap on_exit EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

banner "pipeline: $CONFIG"
log "run root $RUN_ROOT"
if [ -n "$BUCKET" ]; then
  log "restoring from $S3_URI before starting"
  if ! "$PY" "$HERE/checkpoint_manager.py" --action restore "${CFG_ARGS[@]}" "${BUCKET_ARGS[@]}"; then
    echo "  FAILED: restore from $S3_URI (the cause is printed above); fix the cause and run the same command again to continue"
    exit 4
  fi
fi
start_watch

# The stages, in order, each skipped when its complete output exists and fits this run's settings
# (extensions/pipeline/). Started in the background so that the traps above run at once on a signal.
"$PY" -m extensions.pipeline run "${CFG_ARGS[@]}" ${BUCKET_ARGS[@]+"${BUCKET_ARGS[@]}"} ${FORCE_ARGS[@]+"${FORCE_ARGS[@]}"} &
RUNNER_PID=$!
rc=0
wait "$RUNNER_PID" || rc=$?
RUNNER_PID=""
exit "$rc"
