"""More ranks per node than GPUs is one line on every rank (rank 0's is the one shown),
before any process group, instead of ranks dying in set_device."""

import pytest
import torch

from torchtitan.distributed import process_groups


def test_more_ranks_than_gpus_is_refused_on_every_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    for rank in ("0", "5"):
        monkeypatch.setenv("LOCAL_RANK", rank)
        with pytest.raises(
            process_groups.DeviceError,
            match=r"^8 ranks per node \(NGPU\) but 4 GPU\(s\) visible: one rank per"
            r" GPU; set NGPU=4 or fewer, or --training.device=cpu$",
        ):
            process_groups.pick_device("auto")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert process_groups.pick_device("auto") == torch.device("cuda", 3)


def test_cuda_asked_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(process_groups.DeviceError, match="no CUDA device is visible"):
        process_groups.pick_device("cuda")
    assert process_groups.pick_device("auto") == torch.device("cpu")
