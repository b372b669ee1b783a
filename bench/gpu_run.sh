#!/usr/bin/env bash
# One prepared run of bench/gpu_check.py on a GPU machine with what is installed there (bench/results/gpu/NOTES.md):
#
#   bash bench/gpu_run.sh [--dry-run | --stash]
#
# Needs python3 with torch, triton, numpy, transformers and tokenizers; no Ray, no network, no install of this
# project (gpu_check puts this checkout on the path). Runs gpu_check in parts, each in its own process under
# `timeout` and all within BUDGET_S, so a part that hangs or dies costs only itself; each part writes its report
# line by line to $OUT/gpu_check_<part>.md, and this script adds one line per part to $OUT/gpu_run.md:
#
#   warmup-cold    Engine.warm_up with empty compile caches: what a first replica start compiles
#   warmup-cached  the same in a new process, reading the caches the first one wrote
#   kernels        Triton kernels and cascade against their references, incl. > 256 blocks; the paper's shape
#   engine         the engine (off, mlp, full) and every task head against a CPU float64 engine; batch_invariant
#                  bitwise the same in any batch, mode and cache state (issue 32)
#   hybrid         a tiny Qwen3.5 against a CPU float64 engine, the recurrence through flash-linear-attention's
#                  chunked kernel where it is installed
#   flash          the same checks for flash-attn 4, only where its wheels were carried
#   timings        gathers and attention on the paper's shape (flash-attn 4's too when installed)
#
# flash-attn 4 comes as wheels in $WHEELS (default .whl): flash-attn-4, nvidia-cutlass-dsl, its libs-base and
# libs-cu13, quack-kernels, apache-tvm-ffi, torch-c-dlpack-ext, for the machine's Python. libs-cu13 alone is
# ~92 MB, more than one call carries, so split it here (`split -b 45m X.whl X.whl.part-`, plus
# `sha256sum X.whl > X.whl.sha256`) and carry the pieces in two calls on one warm machine: `--stash` keeps what
# a call carried in $STASH_DIR (outside the checkout, so it survives until the machine is given back) and
# exits; the next call joins the parts, checks them against the .sha256, installs the wheels into $SITE and runs.
#
# --dry-run: everything but the GPU work, on any machine: carried wheels are stashed and joined, the install and
# each part's command are written to the summary instead of run, and every part's arguments are parsed by
# gpu_check itself (with all its imports). Variables: OUT (default bench/results/gpu, a temporary directory for
# --dry-run), PYTHON (python3), WHEELS, STASH_DIR (/tmp/radixserve-wheels), SITE (/tmp/radixserve-site),
# CACHE (/tmp/radixserve-compile-cache: the warm-up parts' compile caches), BUDGET_S (570: all parts together).
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=run
case "${1:-}" in
  "") ;;
  --dry-run) MODE=dry-run ;;
  --stash) MODE=stash ;;
  *) echo "usage: bash bench/gpu_run.sh [--dry-run | --stash]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
STASH_DIR=${STASH_DIR:-/tmp/radixserve-wheels}
SITE=${SITE:-/tmp/radixserve-site}
CACHE=${CACHE:-/tmp/radixserve-compile-cache}
BUDGET_S=${BUDGET_S:-570}
if [ -z "${OUT:-}" ]; then
  if [ "$MODE" = dry-run ]; then OUT=$(mktemp -d); else OUT=bench/results/gpu; fi
fi
SUMMARY=$OUT/gpu_run.md
LOG=$OUT/gpu_run.log
export PYTHONUNBUFFERED=1
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }

stash_wheels() {  # what this call carried, kept for the next call on the same machine
  mkdir -p "$STASH_DIR"
  if [ -d "$WHEELS" ] && [ -n "$(ls -A "$WHEELS")" ]; then cp "$WHEELS"/* "$STASH_DIR"/; fi
}

join_wheels() {  # X.whl.part-aa, -ab, ... -> X.whl, checked against X.whl.sha256 when it was carried
  local first whole
  for first in "$STASH_DIR"/*.whl.part-aa; do
    [ -e "$first" ] || continue
    whole=${first%.part-aa}
    cat "$whole".part-* > "$whole"
    if [ -e "$whole.sha256" ] && ! (cd "$STASH_DIR" && sha256sum --status -c "$(basename "$whole").sha256"); then
      note "$(basename "$whole"): its parts do not match its .sha256 yet (carry the other parts); not installed"
      rm "$whole"
      continue
    fi
    rm "$whole".part-*
  done
}

install_flash() {  # true when flash-attn 4's wheels are there (installed, or planned in a dry run)
  ls "$STASH_DIR"/flash_attn_4-*.whl > /dev/null 2>&1 || return 1
  local install=("$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
                 --target "$SITE" "$STASH_DIR"/*.whl)
  if [ "$MODE" = dry-run ]; then
    note "would install: ${install[*]}"
  elif ! "${install[@]}" >> "$LOG" 2>&1; then
    note "flash-attn 4 wheels did not install (see gpu_run.log); the flash part records why it does not load"
  fi
  # --target skips .pth files: nvidia-cutlass-dsl's adds its dsl_packages folder (the `cutlass` module).
  export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
}

probe() {  # versions, and every part's arguments parsed by gpu_check (which imports all it needs)
  "$PYTHON" - "$@" <<'EOF' 2>> "$LOG"
import shlex, sys
sys.path.insert(0, "bench")
import torch, transformers, triton
from gpu_check import parse_args
for args in sys.argv[1:]:
    parse_args(shlex.split(args))
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), triton "
      f"{triton.__version__}, transformers {transformers.__version__}; arguments of every part parse")
EOF
}

part() {  # part NAME SECONDS GPU_CHECK_ARGS: one gpu_check process under its timeout and what is left of the budget
  local name=$1 seconds=$2 args=$3 left=$((BUDGET_S - SECONDS)) started=$SECONDS rc result caches=""
  [ "$seconds" -gt "$left" ] && seconds=$left
  # The warm-up parts' own compile caches, flash-attn 4's switched on: empty for the first, filled for the second.
  [[ $name == warmup-* ]] && caches="env TRITON_CACHE_DIR=$CACHE/triton FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 \
FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$CACHE/flash-attn-cute "
  local command="${caches}timeout -k 10 $seconds $PYTHON bench/gpu_check.py --out $OUT/gpu_check_$name.md $args"
  if [ "$MODE" = dry-run ]; then
    note "| \`$name\` | planned | - | $command |"
    return
  fi
  if [ "$seconds" -lt 10 ]; then
    note "| \`$name\` | not run: the budget of $BUDGET_S s is spent | - | |"
    FAILED=1
    return
  fi
  echo "== $name: $command" >> "$LOG"
  $command >> "$LOG" 2>&1
  rc=$?
  case $rc in
    0) result="pass" ;;
    124|137) result="timed out after $seconds s" ;;
    *) result="exit $rc" ;;
  esac
  [ "$rc" -eq 0 ] || FAILED=1
  note "| \`$name\` | $result | $((SECONDS - started)) | gpu_check_$name.md |"
}

stash_wheels
if [ "$MODE" = stash ]; then
  echo "stashed in $STASH_DIR: $(ls "$STASH_DIR" | tr '\n' ' ')"
  exit 0
fi
mkdir -p "$OUT"
: > "$SUMMARY"
: > "$LOG"
note "# gpu_run ($MODE), $(date -u '+%Y-%m-%d %H:%M UTC')"
note ""
note "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
join_wheels
ATTENTIONS="torch triton"
WARM="triton"
if install_flash; then
  ATTENTIONS="$ATTENTIONS flash"
  WARM="triton flash"
else
  note "flash-attn 4: no flash_attn_4-*.whl carried or stashed; its parts are left out"
fi
PARTS=(
  "warmup-cold 120 --sections warmup --attention $WARM"
  "warmup-cached 60 --sections warmup --attention $WARM"
  "kernels 120 --sections kernels paper --attention torch triton"
  "engine 170 --sections engine tasks invariance --attention torch triton"
  "hybrid 90 --sections hybrid --attention torch triton"
)
[[ $ATTENTIONS == *flash* ]] && PARTS+=("flash 150 --sections kernels engine tasks paper --attention flash")
PARTS+=("timings 120 --sections timings --attention $ATTENTIONS")
ARGS=()
for spec in "${PARTS[@]}"; do read -r _ _ args <<< "$spec"; ARGS+=("$args"); done
if ! versions=$(probe "${ARGS[@]}"); then
  versions="the probe failed (gpu_run.log): python3, its packages, or a part's arguments"
  FAILED=1
fi
note "$versions"
note ""
note "| part | result | seconds | report |"
note "|---|---|---|---|"
[ "$MODE" = run ] && rm -rf "$CACHE"
for spec in "${PARTS[@]}"; do
  read -r name seconds args <<< "$spec"
  part "$name" "$seconds" "$args"
done
note ""
note "Finished in $SECONDS s$([ "$MODE" = dry-run ] && echo " (dry run: nothing ran on a GPU)")."
exit $FAILED
