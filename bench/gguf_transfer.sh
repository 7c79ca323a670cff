#!/usr/bin/env bash
# Moves a fetched GGUF model to a GPU machine whose calls each carry at most 64 MiB: the verified
# file is cut into 56 MB pieces, one ignored folder per piece; one quick call per piece copies its
# piece under /tmp there (files outside the checkout survive while the machine stays warm); a last
# step concatenates the pieces and hands the result to `extensions.models adopt`, which keeps it only
# if its size and sha256 match the recorded ones.
#
#   here:    bash bench/gguf_transfer.sh split qwen2.5-coder-0.5b DEST   # DEST/.gguf-1 ... DEST/.gguf-N
#   there:   bash bench/gguf_transfer.sh receive .gguf-3                  # one call per piece, any order
#   there:   bash bench/gguf_transfer.sh assemble qwen2.5-coder-0.5b      # into $KERNEL_RL_MODEL_CACHE
#
# Receiving a piece twice is harmless (pieces are files named by their index, not appended blindly).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=${PYTHON:-python3}
PIECES=${GGUF_PIECES_DIR:-/tmp/gguf-pieces}
PIECE_BYTES=56000000

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

case "${1:-}" in
  split)
    [ $# -eq 3 ] || { usage >&2; exit 2; }
    source_file=$(cd "$HERE" && "$PY" -m extensions.models path "$2")
    rm -rf "$3"/.gguf-[0-9]*
    tmp=$(mktemp -d)
    split -b "$PIECE_BYTES" -d -a 2 "$source_file" "$tmp/piece-"
    count=0
    for piece in "$tmp"/piece-*; do
      count=$((count + 1))
      mkdir -p "$3/.gguf-$count"
      mv "$piece" "$3/.gguf-$count/"
    done
    rmdir "$tmp"
    echo "$count pieces of $source_file in $3/.gguf-1 ... $3/.gguf-$count"
    ;;
  receive)
    [ $# -eq 2 ] && [ -d "$2" ] || { echo "receive needs a piece folder (.gguf-N)" >&2; exit 2; }
    mkdir -p "$PIECES"
    cp -f "$2"/piece-* "$PIECES"/
    echo "received $(ls "$2"); $(ls "$PIECES" | wc -l) piece(s) in $PIECES, $(du -sb "$PIECES" | cut -f1) bytes"
    ;;
  assemble)
    [ $# -eq 2 ] || { usage >&2; exit 2; }
    joined="$PIECES/assembled.gguf"
    cat "$PIECES"/piece-* > "$joined"
    (cd "$HERE" && "$PY" -m extensions.models adopt "$2" "$joined")
    rm -f "$PIECES"/piece-*
    ;;
  *) usage >&2; exit 2 ;;
esac
