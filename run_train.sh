#!/usr/bin/env bash
# Launch training with torchrun.
#   NGPU=8 CONFIG_FILE=train_configs/llama3_8b.toml ./run_train.sh --parallelism.tensor_parallel_degree=2
# NGPU      processes (default: number of CUDA devices, else 2 CPU ranks)
# CONFIG_FILE  TOML file (default: train_configs/llama3_debug.toml)
# LOG_RANK  whose console output to show (default 0; comma-separated list allowed)
# TORCHRUN_LOG_DIR  also write every rank's stdout/stderr to files under this folder
# Several nodes (one launch per node, e.g. scripts/multinode_trainer.slurm): NNODES (default 1),
#   RDZV_ENDPOINT=host:port or MASTER_ADDR (+ MASTER_PORT, default 29500) of the rendezvous
#   host, RDZV_ID (default torchtitan), NODE_RANK (optional: c10d rendezvous assigns ranks).
#   NGPU is then per node; the world is NGPU x NNODES.
# Extra arguments are config overrides (--section.key=value); --help lists every key.
#
# Signals: SIGTERM (Slurm's preemption, scancel, time limit) and SIGUSR1 (sbatch --signal=USR1@<s>)
# reach every rank (passed on by this script and torchtitan.launcher; torchrun itself keeps
# running): the ranks finish the step, checkpoint it and stop. Exit code: 0 done, 1 failed,
# 2 bad input, 75 preempted (checkpoint saved: rerun to resume; Slurm: RequeueExit=75 or
# scripts/multinode_trainer.slurm). torchrun exits 1 or 0 whatever the ranks meant: the
# ranks say it in a status file this script reads (torchtitan/resilience/exit_status.py).
set -euo pipefail
GOT_SIGNAL=""
TR_PID=""
on_signal() {  # note it; pass it on to torchrun once it runs (it passes it to the ranks)
  GOT_SIGNAL=$1
  if [[ -n "$TR_PID" ]]; then kill -s "$1" "$TR_PID" 2>/dev/null || true; fi
}
trap 'on_signal TERM' TERM
trap 'on_signal USR1' USR1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if [[ -z "${NGPU:-}" ]]; then
  NGPU=0
  if command -v nvidia-smi >/dev/null 2>&1; then NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
  [[ "$NGPU" -gt 0 ]] || NGPU=2
fi
if ! [[ "$NGPU" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: NGPU=$NGPU: must be a positive integer (processes per node)" >&2; exit 2
fi
NNODES="${NNODES:-1}"
if ! [[ "$NNODES" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: NNODES=$NNODES: must be a positive integer (the number of nodes, one launch per node)" >&2; exit 2
fi
LAUNCH=(--standalone)
if [[ "$NNODES" -gt 1 ]]; then
  ENDPOINT="${RDZV_ENDPOINT:-}"
  if [[ -z "$ENDPOINT" ]]; then
    if [[ -z "${MASTER_ADDR:-}" ]]; then
      echo "error: NNODES=$NNODES needs the rendezvous host: set RDZV_ENDPOINT=host:port, or MASTER_ADDR=host (and MASTER_PORT, default 29500)" >&2
      exit 2
    fi
    ENDPOINT="$MASTER_ADDR:${MASTER_PORT:-29500}"
  fi
  if ! [[ "$ENDPOINT" =~ ^[^:[:space:]]+:[0-9]+$ ]] || (( ${ENDPOINT##*:} < 1 || ${ENDPOINT##*:} > 65535 )); then
    echo "error: rendezvous endpoint '$ENDPOINT' (RDZV_ENDPOINT, or MASTER_ADDR:MASTER_PORT): must be host:port with a port in 1-65535" >&2
    exit 2
  fi
  if [[ -n "${NODE_RANK:-}" ]] && ! { [[ "$NODE_RANK" =~ ^[0-9]+$ ]] && (( NODE_RANK < NNODES )); }; then
    echo "error: NODE_RANK=$NODE_RANK: must be an integer in 0..$(( NNODES - 1 )) (NNODES=$NNODES), or unset" >&2
    exit 2
  fi
  LAUNCH=(--nnodes="$NNODES" --rdzv-backend=c10d --rdzv-endpoint="$ENDPOINT" --rdzv-id="${RDZV_ID:-torchtitan}")
  [[ -z "${NODE_RANK:-}" ]] || LAUNCH+=(--node-rank="$NODE_RANK")
fi
WORLD=$(( NGPU * NNODES ))
CONFIG_FILE="${CONFIG_FILE:-$ROOT/train_configs/llama3_debug.toml}"
# A relative config path may be given from the repo root while running elsewhere.
[[ -f "$CONFIG_FILE" || ! -f "$ROOT/$CONFIG_FILE" ]] || CONFIG_FILE="$ROOT/$CONFIG_FILE"
LOG_RANK="${LOG_RANK:-0}"
if [[ -n "${TORCHRUN_LOG_DIR:-}" ]]; then
  if [[ -e "$TORCHRUN_LOG_DIR" && ! -d "$TORCHRUN_LOG_DIR" ]]; then
    echo "error: TORCHRUN_LOG_DIR='$TORCHRUN_LOG_DIR' is not a folder; give a folder for the ranks' logs or unset it" >&2
    exit 2
  fi
  LAUNCH+=(--log-dir="$TORCHRUN_LOG_DIR" --tee=3)
fi

for arg in "$@"; do
  if [[ "$arg" == "--help" || "$arg" == "-h" ]]; then exec "$PY" -m torchtitan.checks --help; fi
done
# Fail fast, in one process and without importing torch, on any config problem (model states
# over the memory budget included: LOCAL_WORLD_SIZE = the ranks sharing this node's memory).
MODE=$(TORCHTITAN_PRINT_MODE=1 NGPU="$WORLD" LOCAL_WORLD_SIZE="$NGPU" "$PY" -m torchtitan.checks --job.config_file "$CONFIG_FILE" "$@") || exit $?
if [[ "$MODE" == "dry_run" ]]; then
  # One process plans a job of NGPU x NNODES ranks with a fake process group.
  WORLD_SIZE="$WORLD" exec "$PY" -m torchtitan.dry_run --job.config_file "$CONFIG_FILE" "$@"
fi

# On CPU, share the cores between ranks instead of letting every rank use all of them.
if [[ -z "${OMP_NUM_THREADS:-}" ]]; then
  cores=$(nproc 2>/dev/null || echo 1)
  threads=$(( cores / NGPU )); [[ $threads -ge 1 ]] || threads=1
  export OMP_NUM_THREADS=$threads
fi

if [[ -n "$GOT_SIGNAL" ]]; then
  echo "[torchtitan] preempted (SIG$GOT_SIGNAL) before training started: nothing to save; exit 75: rerun the same command to resume" >&2
  exit 75
fi
STATUS_FILE=$(mktemp "${TMPDIR:-/tmp}/torchtitan-status.XXXXXX")
trap 'rm -f "$STATUS_FILE"' EXIT
# The launcher has a process group of its own (a terminal's ^C reaches it once, from here):
# torchrun stops the ranks on these, this script waits for it.
for sig in INT HUP QUIT; do trap "[[ -z \$TR_PID ]] || kill -s $sig \$TR_PID 2>/dev/null || true" "$sig"; done
TORCHTITAN_STATUS_FILE="$STATUS_FILE" "$PY" -m torchtitan.launcher "${LAUNCH[@]}" --nproc_per_node="$NGPU" \
  --local-ranks-filter "$LOG_RANK" --signals-to-handle=SIGINT,SIGHUP,SIGQUIT \
  -m torchtitan.train --job.config_file "$CONFIG_FILE" "$@" &
TR_PID=$!
if [[ -n "$GOT_SIGNAL" ]]; then kill -s "$GOT_SIGNAL" "$TR_PID" 2>/dev/null || true; fi  # came just before
rc=0
while kill -0 "$TR_PID" 2>/dev/null; do  # a trapped signal interrupts wait: wait again
  if wait "$TR_PID"; then rc=0; else rc=$?; fi
done
# the last wait may have been interrupted just as torchrun ended: its status is kept for this one
if wait "$TR_PID" 2>/dev/null; then rc=0; else r=$?; [[ $r -eq 127 ]] || rc=$r; fi

if [[ -s "$STATUS_FILE" ]]; then  # a rank ended the run on purpose: its code, and its line if not shown
  read -r code writer < "$STATUS_FILE"
  if [[ ",$LOG_RANK," != *",$writer,"* ]]; then
    line=$(sed -n 2p "$STATUS_FILE")
    if [[ "$code" == 0 || "$code" == 75 ]]; then echo "[torchtitan] $line" >&2; else echo "error: $line" >&2; fi
  fi
  rc=$code
elif [[ -n "$GOT_SIGNAL" && $rc -ne 0 ]]; then
  echo "[torchtitan] preempted (SIG$GOT_SIGNAL) before its checkpoint was saved (during start-up, or the save failed); exit 75: rerun the same command to resume from the last complete checkpoint" >&2
  rc=75
fi
exit "$rc"
