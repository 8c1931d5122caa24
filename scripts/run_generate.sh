#!/usr/bin/env bash
# Generate text from a checkpoint on NGPU ranks (tensor parallel over all of them).
#   NGPU=2 CONFIG_FILE=train_configs/llama3_debug.toml CHECKPOINT_DIR=outputs/llama3_debug/checkpoint \
#     PROMPT="def main():" ./scripts/run_generate.sh --max_new_tokens=32 --parallelism.tensor_parallel_degree=2
# NGPU            processes (default 1: one process, no torchrun)
# CONFIG_FILE     the job's TOML: model, flavor, tokenizer, context (default train_configs/llama3_debug.toml)
# CHECKPOINT_DIR  a step folder, a checkpoint folder (its newest complete step) or a Hugging
#                 Face folder (default: the job's own <dump_folder>/checkpoint)
# PROMPT          the text to continue (a --prompt=... argument wins)
# LOG_RANK        whose console output to show (default 0)
# Other arguments: --max_new_tokens, --temperature (0 = greedy), --top_k, --seed, --out FILE,
# and config overrides (--section.key=value). Exit code: 0 done, 2 bad input (one line, before
# any process starts), 1 failed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

NGPU="${NGPU:-1}"
if ! [[ "$NGPU" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: NGPU=$NGPU: must be a positive integer (processes)" >&2; exit 2
fi
CONFIG_FILE="${CONFIG_FILE:-$ROOT/train_configs/llama3_debug.toml}"
[[ -f "$CONFIG_FILE" || ! -f "$ROOT/$CONFIG_FILE" ]] || CONFIG_FILE="$ROOT/$CONFIG_FILE"
ARGS=(--job.config_file "$CONFIG_FILE" --prompt="${PROMPT:-}")
[[ -z "${CHECKPOINT_DIR:-}" ]] || ARGS+=(--checkpoint="$CHECKPOINT_DIR")
ARGS+=("$@")  # later flags win: a --prompt= or --checkpoint= argument overrides the variable
GEN="$ROOT/scripts/generate.py"

if [[ "$NGPU" -eq 1 ]]; then exec "$PY" "$GEN" "${ARGS[@]}"; fi
# Every check in one process first, so bad input is one line (not one per rank plus torchrun's report).
WORLD_SIZE="$NGPU" "$PY" "$GEN" --check_only "${ARGS[@]}" || exit $?
if [[ -z "${OMP_NUM_THREADS:-}" ]]; then  # share the CPU cores between the ranks
  threads=$(( $(nproc 2>/dev/null || echo 1) / NGPU )); [[ $threads -ge 1 ]] || threads=1
  export OMP_NUM_THREADS=$threads
fi
exec "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NGPU" \
  --local-ranks-filter "${LOG_RANK:-0}" "$GEN" "${ARGS[@]}"
