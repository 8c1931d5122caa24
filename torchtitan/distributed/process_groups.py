"""Process groups: the device and backend a rank trains on, joining and leaving the job's
process group (clean shutdown included), group options, and telling a communication failure
(a peer died or stalled) from other errors."""

import gc
import os
from datetime import timedelta

import torch
import torch.distributed as dist


class DeviceError(RuntimeError):
    """The ranks do not fit the devices; raised alike on every rank of a node, before any
    process group, so the logged rank reports it too."""


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                "--training.device=cuda but no CUDA device is visible; use auto or cpu"
            )
        gpus = torch.cuda.device_count()
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if per_node > gpus:
            raise DeviceError(
                f"{per_node} ranks per node (NGPU) but {gpus} GPU(s) visible: one rank per GPU; set NGPU={gpus}"
                " or fewer, or --training.device=cpu"
            )
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def init_distributed(device: torch.device, timeout_seconds: int = 300) -> None:
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend_for(device.type),
            device_id=device if device.type == "cuda" else None,
            timeout=timedelta(seconds=timeout_seconds),
        )


def flight_recorder_env(comm, dump_folder: str) -> dict[str, str]:
    """CUDA: the environment NCCL's flight recorder reads when the process group starts
    ([comm] trace_buf_size, save_traces_folder, save_traces_file_prefix): its size, a dump
    on a collective timeout, and where each rank's dump goes. Values the user exported win."""
    if comm.trace_buf_size <= 0:
        return {}
    prefix = os.path.join(dump_folder, comm.save_traces_folder, comm.save_traces_file_prefix)
    return {
        "TORCH_FR_BUFFER_SIZE": str(comm.trace_buf_size),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
    }


def start_flight_recorder(comm, dump_folder: str, device_type: str) -> None:
    """Set flight_recorder_env (CUDA only; gloo has no flight recorder) before the group starts."""
    if device_type != "cuda":
        return
    env = flight_recorder_env(comm, dump_folder)
    if env:
        os.makedirs(os.path.dirname(env["TORCH_FR_DUMP_TEMP_FILE"]), exist_ok=True)
    for key, value in env.items():
        os.environ.setdefault(key, value)


def set_collective_timeout(seconds: float) -> int:
    """[comm] train_timeout_seconds after the first step: every process group of this rank
    (the world's and the mesh's) gets the new timeout; returns how many were set."""
    from torch.distributed import distributed_c10d as c10d

    groups = [g for g in c10d._world.pg_map if g is not None and not c10d._rank_not_in_group(g)]
    for group in groups:
        c10d._set_pg_timeout(timedelta(seconds=seconds), group)
    return len(groups)


def group_options(device_type: str, timeout_seconds: int) -> object:
    """Process-group options carrying the collective timeout. DeviceMesh creates its groups
    with the backend's default (30 min on gloo) unless given options, not the world's."""
    if device_type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
    else:
        opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timedelta(seconds=timeout_seconds)
    return backend_for(device_type), opts


def shutdown_distributed() -> None:
    """Tear down cleanly. On CPU/gloo a worker thread can abort the interpreter at exit after
    FSDP ran, turning a finished run into a failed one; collecting garbage (dropping the
    last references to work objects) before destroying the group prevents it."""
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            gc.collect()
            dist.destroy_process_group()


# What gloo / NCCL say when a peer is gone or silent (not when a collective is misused).
_COMM_FAILURE_WORDS = (
    "gloo/transport/",
    "connection closed",
    "connection reset",
    "connection refused",
    "broken pipe",
    "timed out",
    "socket timeout",
    "nccl communicator was aborted",
    "watchdog caught collective operation timeout",
)


def _unwrap(e: BaseException) -> BaseException:
    """DCP wraps each rank's exception in a CheckpointException: look at the first one."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        return first[0] if isinstance(first, tuple) else first
    return e


def is_comm_failure(e: BaseException) -> bool:
    """A collective that failed because a peer died, hung or closed its connection."""
    e = _unwrap(e)
    if isinstance(e, (dist.DistNetworkError, dist.DistStoreError)):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(w in text for w in _COMM_FAILURE_WORDS)


def comm_failure_summary(e: BaseException) -> str:
    e = _unwrap(e)
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:160] if lines else ''}"
