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
SCRIPTS_DIR="${KERNEL_RL_SCRIPTS_DIR:-$HERE}"  # where the stage scripts live (tests use stand-ins)
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
duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

if [ -n "$CONFIG" ] && [ "$SMOKE" = 1 ]; then
  echo "run_pipeline.sh: give --config or --smoke, not both" >&2; exit 2
fi
if [ -n "$CONFIG" ]; then
  [ -f "$CONFIG" ] || { echo "run_pipeline.sh: config file not found: $CONFIG" >&2; exit 2; }
  CONFIG="$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")"
elif [ "$SMOKE" = 1 ]; then
  CONFIG="$HERE/configs/smoke.yaml"
fi
# Without a config named, resume_training.py --print-state reports the one the machine calls for
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

# Stage status from resume_training.py; it fails (exit 2, with the keys that differ) when a saved
# training result was made with other settings and --force was not given.
read_state() {
  local assignments
  assignments="$("$PY" "$HERE/resume_training.py" "${CFG_ARGS[@]}" ${BUCKET_ARGS[@]+"${BUCKET_ARGS[@]}"} \
    ${FORCE_ARGS[@]+"${FORCE_ARGS[@]}"} --print-state)" || return $?
  eval "$assignments"
}
read_state || exit $?
if [ -z "$CONFIG" ]; then
  CONFIG="$CONFIG_FILE"
  CFG_ARGS=(--config "$CONFIG" ${SETS[@]+"${SETS[@]}"})
  log "no --config given: $CONFIG ($CONFIG_REASON)"
fi

STAGE_LINES=()
FAILED_STAGE=""
INTERRUPTED=""
CURRENT_STAGE=""
CHILD_PID=""
WATCH_PID=""
PIPELINE_START=$SECONDS

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

summary() {
  banner "summary ($(duration $((SECONDS - PIPELINE_START))))"
  local line
  for line in ${STAGE_LINES[@]+"${STAGE_LINES[@]}"}; do echo "  $line"; done
  # What RL really did (candidates per verifier stage, optimizer steps), read from its logs.
  "$PY" -m extensions.runtime.activity "${CFG_ARGS[@]}" 2>/dev/null | sed 's/^/  /' || true
  read_state 2>/dev/null || true
  echo "  run root     $RUN_ROOT"
  echo "  data         $DATA_DIR"
  echo "  SFT adapter  $SFT_FINAL $([ "$SFT_DONE" = 1 ] && echo '(complete)' || echo '(not yet)')"
  echo "  RL adapter   $RL_FINAL $([ "$RL_DONE" = 1 ] && echo '(complete)' || echo '(not yet)')"
  echo "  comparison   $COMPARE_MD $([ "$EVAL_DONE" = 1 ] && echo '' || echo '(not yet)')"
  echo "  logs         $LOGS_DIR"
  [ -n "$BUCKET" ] && echo "  S3 mirror    $S3_URI"
  if [ -n "$INTERRUPTED" ]; then
    echo "  INTERRUPTED: $FAILED_STAGE; run the same command again to continue from the last checkpoint"
  elif [ -n "$FAILED_STAGE" ]; then
    echo "  FAILED: $FAILED_STAGE; fix the cause and run the same command again to continue"
  fi
  return 0
}

on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$CHILD_PID" ] && kill -0 "$CHILD_PID" 2>/dev/null; then
    kill -TERM "$CHILD_PID" 2>/dev/null || true
    wait "$CHILD_PID" 2>/dev/null || true
  fi
  stop_watch
  summary
  [ -n "${LOCK_TOKEN:-}" ] && "$PY" -m extensions.runtime.run_lock release "$RUN_ROOT" --token "$LOCK_TOKEN" || true
  exit "$rc"
}

on_signal() {
  local name=$1
  log "received SIG$name: asking the running stage to save and stop"
  if [ -n "$CHILD_PID" ] && kill -0 "$CHILD_PID" 2>/dev/null; then
    kill -TERM "$CHILD_PID" 2>/dev/null || true
    wait "$CHILD_PID" 2>/dev/null || true
  fi
  CHILD_PID=""
  INTERRUPTED=1
  FAILED_STAGE="${CURRENT_STAGE:-pipeline} (SIG$name)"
  [ -n "$CURRENT_STAGE" ] && STAGE_LINES+=("$(printf '%-8s interrupted by SIG%s' "$CURRENT_STAGE" "$name")")
  exit 130
}

# The run lock, held for this shell; the stages and the restore share it through KERNEL_RL_RUN_LOCK.
LOCK_TOKEN="$("$PY" -m extensions.runtime.run_lock acquire "$RUN_ROOT" --pid $$)" || exit 73
export KERNEL_RL_RUN_LOCK="$LOCK_TOKEN"

trap on_exit EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

run_stage() {
  local name=$1 done_var=$2 stale_var=$3 script=$4
  shift 4
  if [ "${!done_var}" = 1 ]; then
    log "stage $name: complete output exists, skipped"
    STAGE_LINES+=("$(printf '%-8s skipped (already complete)' "$name")")
    return 0
  fi
  CURRENT_STAGE=$name
  banner "stage $name"
  local start_with=("$PY")
  # Training: one process per GPU through accelerate when there are several (see TRAIN_LAUNCHER).
  [ "$script" = train_integrated.py ] && eval "start_with=($TRAIN_LAUNCHER)"
  local stage_args=("$@")
  # --force: a stage whose saved result was made with other settings is retrained from its start.
  [ -n "$stale_var" ] && [ "${!stale_var:-0}" = 1 ] && stage_args+=(--force)
  local command=("${start_with[@]}" "$SCRIPTS_DIR/$script" "${stage_args[@]}" "${CFG_ARGS[@]}")
  log "${command[*]}"
  local start=$SECONDS rc=0
  "${command[@]}" &
  CHILD_PID=$!
  wait "$CHILD_PID" || rc=$?
  CHILD_PID=""
  local took
  took=$(duration $((SECONDS - start)))
  if [ "$rc" = 75 ]; then  # train_integrated.py: saved a complete checkpoint on request, then stopped
    FAILED_STAGE="stage $name (stopped after saving a checkpoint; run the same command to continue)"
    STAGE_LINES+=("$(printf '%-8s STOPPED after %s with a complete checkpoint' "$name" "$took")")
    log "stage $name stopped after saving a checkpoint ($took); run the same command again to continue"
    exit "$rc"
  fi
  if [ "$rc" != 0 ]; then
    FAILED_STAGE="stage $name (exit code $rc)"
    STAGE_LINES+=("$(printf '%-8s FAILED with exit code %s after %s' "$name" "$rc" "$took")")
    log "stage $name FAILED with exit code $rc after $took"
    exit "$rc"
  fi
  read_state || { local state_rc=$?; FAILED_STAGE="after stage $name: the run's saved results do not fit this command (see above)"; exit "$state_rc"; }
  if [ "${!done_var}" != 1 ]; then
    FAILED_STAGE="stage $name (exited 0 without its complete output)"
    STAGE_LINES+=("$(printf '%-8s INCOMPLETE after %s' "$name" "$took")")
    log "stage $name exited 0 but its output is not complete (stopped by a save request?); run again to continue"
    exit 3
  fi
  STAGE_LINES+=("$(printf '%-8s done in %s' "$name" "$took")")
  log "stage $name done in $took"
}

banner "pipeline: $CONFIG"
log "run root $RUN_ROOT"
if [ -n "$BUCKET" ]; then
  log "restoring from $S3_URI before starting"
  if ! "$PY" "$HERE/checkpoint_manager.py" --action restore "${CFG_ARGS[@]}" "${BUCKET_ARGS[@]}"; then
    FAILED_STAGE="restore from $S3_URI (the cause is printed above)"
    exit 4
  fi
  read_state || { state_rc=$?; FAILED_STAGE="restored results do not fit this command (see above)"; exit "$state_rc"; }
fi
start_watch

run_stage prepare PREPARE_DONE "" prepare_data.py
run_stage sft SFT_DONE SFT_STALE train_integrated.py --stage sft
run_stage rl RL_DONE RL_STALE train_integrated.py --stage rl
run_stage eval EVAL_DONE "" evaluate.py --compare
log "pipeline finished"
