"""The one hardware table (torchtitan/hardware.py): the config's profile names are its entries,
every GPU name it lists chooses its own entry and no other, an unknown GPU is one line and never
another GPU's profile, and the measured and the predicted MFU divide by the same figure."""

import dataclasses
import typing
from types import SimpleNamespace as NS

import pytest

from torchtitan import hardware
from torchtitan.config.job_config import Hardware

AUTO_HW = NS(profile="auto", **dict.fromkeys(hardware.OVERRIDES, "auto"))


def test_the_configs_profile_names_are_the_tables_entries():
    choices = typing.get_args(typing.get_type_hints(Hardware)["profile"])
    assert [c for c in choices if c not in ("auto", "local")] == list(hardware.PROFILES)
    assert set(hardware.NAMES) == set(choices) - {"auto"}


def test_the_configs_hardware_keys_are_the_overrides():
    fields = [f.name for f in dataclasses.fields(Hardware)]
    assert fields == ["profile", *hardware.OVERRIDES]


def test_every_entry_is_complete_and_named_by_its_key():
    for name, p in hardware.PROFILES.items():
        assert p.name == name
        assert p.peak_tflops["bfloat16"] > p.peak_tflops["float32"] > 0, name
        assert (
            p.peak_tflops.get("float8", 2 * p.peak_tflops["bfloat16"]) > p.peak_tflops["bfloat16"]
        )
        assert p.memory_gib > 0 and p.hbm_gbps > 0 and p.gpus_per_node >= 1, name
        assert 0 < p.gemm_efficiency <= 1 and 0 < p.clock_factor <= 1, name


def test_every_listed_gpu_name_chooses_its_own_entry_and_no_two_entries_share_one():
    listed = [(n, p.name) for p in hardware.PROFILES.values() for n in p.device_names]
    assert len({hardware.name_words(n) for n, _ in listed}) == len(listed)
    for device_name, profile in listed:
        assert hardware.gpu_profile_name(device_name) == profile
        assert hardware.resolve(AUTO_HW, "cuda", gpu_names=[device_name] * 8).name == profile


@pytest.mark.parametrize(
    "device_name, profile",
    [
        ("NVIDIA H100 80GB HBM3", "h100_sxm"),
        ("NVIDIA H100 SXM5 80GB", "h100_sxm"),  # the form SXM is the default, not a word
        ("NVIDIA H100 PCIe", "h100_pcie"),  # not the SXM part
        ("NVIDIA H100 NVL", "h100_nvl"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),  # not the B200
        ("NVIDIA GH200 480GB", "gh200"),  # not the H200
        ("NVIDIA A100-SXM4-40GB", "a100_40gb"),  # not the 80 GB part
        ("NVIDIA A100-PCIE-40GB", "a100_pcie_40gb"),
        ("nvidia a100 pcie 40gb", "a100_pcie_40gb"),  # case and separators are not the name
        ("NVIDIA A100-PCIE-80GB", "a100_pcie_80gb"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10G", None),  # a cloud part of its own: unknown, not the A10
        ("NVIDIA H100", None),  # no memory size: SXM 80 GB or another H100 cannot be told
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_the_name_matcher_never_guesses(device_name, profile):
    assert hardware.gpu_profile_name(device_name) == profile


def test_an_unknown_gpu_is_one_line_naming_it_and_the_keys_never_h100():
    with pytest.raises(hardware.UnknownGPU) as info:
        hardware.resolve(AUTO_HW, "cuda", gpu_names=["NVIDIA L20"])
    line = str(info.value)
    assert "\n" not in line and "'NVIDIA L20'" in line
    assert "--hardware.profile=" in line and "--hardware.peak_tflops=" in line
    with pytest.raises(hardware.UnknownGPU, match="different profiles"):
        hardware.resolve(AUTO_HW, "cuda", gpu_names=["NVIDIA L4", "NVIDIA A10"])
    # a named profile is taken as given, whatever is visible
    named = NS(**{**vars(AUTO_HW), "profile": "l40s"})
    assert hardware.resolve(named, "cuda", gpu_names=["NVIDIA L20"]).name == "l40s"
    # no GPU visible (a dry run of a GPU job on a CPU machine): the documented default part
    assert hardware.resolve(AUTO_HW, "cuda", gpu_names=[]).name == hardware.WITHOUT_GPU


def test_the_dry_run_prints_the_unknown_gpu_line_and_predicts_no_step_time(monkeypatch, capsys):
    from torchtitan.planning.step_time import local_profile

    monkeypatch.setattr(local_profile, "gpu_names", lambda: ["NVIDIA L20"])
    cfg = NS(hardware=AUTO_HW)
    assert local_profile.job_hardware(cfg, "cuda", measure=False) is None
    assert capsys.readouterr() == ("", "")  # the trainer's ranks: not from every rank
    assert local_profile.job_hardware(cfg, "cuda", measure=True) is None
    out = capsys.readouterr().err.splitlines()  # a warning: stderr
    assert len(out) == 1 and out[0].startswith(
        "[dry run] no step-time prediction: GPU 'NVIDIA L20'"
    )


def test_measured_and_predicted_mfu_divide_by_the_same_figure():
    for p in hardware.PROFILES.values():
        for device_name in p.device_names:
            predicted = hardware.resolve(AUTO_HW, "cuda", gpu_names=[device_name])
            assert hardware.measured_peak_tflops(device_name) * 1e12 == predicted.datasheet_flops(
                "bfloat16"
            )
        assert hardware.measured_peak_tflops("any", p.name) == p.peak_tflops["bfloat16"]
    # the clock factor lowers the model's peak, never the MFU's denominator
    teton = hardware.PROFILES["h100_grand_teton"]
    assert teton.datasheet_flops("bfloat16") == hardware.PROFILES["h100_sxm"].datasheet_flops(
        "bfloat16"
    )
    assert teton.peak_flops("bfloat16") == teton.datasheet_flops("bfloat16") * teton.clock_factor


def test_the_peak_key_sets_bf16_and_scales_the_other_dtypes_alike():
    hw = NS(**{**vars(AUTO_HW), "profile": "a100_80gb", "peak_tflops": 156.0})
    p = hardware.resolve(hw, "cuda")
    assert p.peak_tflops == {"bfloat16": 156.0, "float32": 9.75}
    assert hardware.PROFILES["a100_80gb"].peak_tflops["bfloat16"] == 312.0  # the table unchanged
