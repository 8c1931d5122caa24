"""scripts/memory_check.py's pure parts: the matrix, plan.json's role records, the rank files
and the median / max / error arithmetic. No run is launched."""

import importlib.util
import json
import os
import sys

import pytest

SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "scripts",
    "memory_check.py",
)
_spec = importlib.util.spec_from_file_location("memory_check", SCRIPT)
mc = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("memory_check", mc)  # dataclasses look their module up
_spec.loader.exec_module(mc)

MIB = 2**20


# ---------------------------------------------------------------- the matrix


def test_matrix_size_names_and_ranks():
    jobs = mc.parse_matrix()
    assert len(jobs) >= 24
    names = [j.name for j in jobs]
    assert len(set(names)) == len(names)
    assert all(1 <= j.ngpu <= 8 for j in jobs)
    assert sum(j.ngpu <= 4 for j in jobs) > len(jobs) * 3 // 4  # most jobs small, for time


def test_matrix_covers_every_dimension():
    jobs = mc.parse_matrix()
    covered = set().union(*(mc.tags(j) for j in jobs))
    assert mc.REQUIRED_TAGS <= covered, sorted(mc.REQUIRED_TAGS - covered)
    # each pipeline schedule at several microbatch counts
    for schedule in ("1F1B", "Interleaved1F1B", "ZBVZeroBubble"):
        counts = {t for t in covered if t.startswith(f"pp:{schedule}:mb")}
        assert len(counts) >= 2, (schedule, counts)


def test_matrix_jobs_are_well_formed():
    for job in mc.parse_matrix():
        s = mc.shape(job)  # degrees multiply to the ranks
        assert s.rep * s.shard * s.tp * s.pp * s.cp == job.ngpu
        args = job.overrides()
        assert args[: len(mc.BASE)] == list(mc.BASE)
        assert len({a.split("=")[0] for a in args}) == len(args), job.name  # no key twice
        assert any(a.startswith("--training.mixed_precision_param=") for a in args)
        assert not any("dump_folder" in a or "dry_run" in a or "cpu_memory_peak" in a for a in args)
        if "grad_accum" in mc.tags(job):
            assert s.global_batch == 2 * s.local_batch * s.dp, job.name
        if s.pp > 1:
            assert s.microbatch_size == 1, job.name
        if job.value(mc.KEYS["fsdp_ac"], "auto") != "auto":
            assert job.value(mc.KEYS["impl"]) == "simple_fsdp", job.name  # the config check's rule
        assert os.path.isfile(job.config_file)


def test_matrix_models_from_names():
    jobs = {j.name: j for j in mc.parse_matrix()}
    prefixes = {"llama_": "llama3", "ds_": "deepseek_v3", "qwen_": "qwen3", "qmoe_": "qwen3_moe"}
    assert all(
        j.model == next(m for p, m in prefixes.items() if n.startswith(p)) for n, j in jobs.items()
    )


def test_parse_settings_short_keys_presets_and_errors():
    got = dict(mc.parse_settings(["tp=2", "ac=layer", "training.steps=5"], "t"))
    assert got == {
        "parallelism.tensor_parallel_degree": "2",
        "activation_checkpoint.mode": "selective",
        "activation_checkpoint.selective_ac_option": "2",
        "training.steps": "5",
    }
    for bad in (
        ["tp"],
        ["bogus=1"],
        ["ac=sometimes"],
        ["tp=2", "parallelism.tensor_parallel_degree=4"],
    ):
        with pytest.raises(ValueError):
            mc.parse_settings(bad, "t")


def test_parse_matrix_rejects_duplicates_and_bad_rows():
    with pytest.raises(ValueError, match="twice"):
        mc.parse_matrix("llama_a 2\nllama_a 4\n")
    with pytest.raises(ValueError, match="ranks"):
        mc.parse_matrix("llama_a 9\n")
    with pytest.raises(ValueError, match="starts with"):
        mc.parse_matrix("gpt_a 2\n")
    jobs = mc.parse_matrix("# comment\n\nds_x 4  ep=2  # trailing\n")
    assert [(j.name, j.ngpu, j.model) for j in jobs] == [("ds_x", 4, "deepseek_v3")]


def test_tags_of_layouts():
    def t(line):
        return mc.tags(mc.parse_matrix(line)[0])

    assert {"dp:ddp"} <= t("llama_a 2 rep=2 shard=1") and "dp:fsdp2" not in t(
        "llama_a 2 rep=2 shard=1"
    )
    assert {"dp:hsdp", "dp:simple_fsdp"} <= t("llama_a 4 impl=simple_fsdp rep=2 shard=2")
    assert "ep:all_of_dp_shard" in t("ds_a 2 ep=2")
    assert "ep:part_of_dp_shard" in t("ds_a 4 ep=2")
    assert "ep:all_of_dp_shard" in t(
        "ds_a 2 tp=2 ep=2"
    )  # EP takes the TP ranks, none of dp_shard's 1
    assert {"pp:ZBVZeroBubble", "pp_mb:8", "pp:ZBVZeroBubble:mb8"} <= t(
        "llama_a 2 pp=2 schedule=ZBVZeroBubble lbs=8"
    )
    assert "grad_accum" in t("llama_a 2 gbs=8") and "grad_accum" not in t("llama_a 2 gbs=4")
    with pytest.raises(ValueError, match="degrees"):
        mc.shape(mc.parse_matrix("llama_a 4 rep=2 shard=1")[0])


# ---------------------------------------------------------------- plan.json


def record(role, ranks, predicted=100 * MIB, worst=None):
    return {
        "role": role,
        "ranks": ranks,
        "predicted_peak_bytes": predicted,
        "worst_case_peak_bytes": predicted if worst is None else worst,
        "peak_at": "backward layers.0",
        "breakdown": {"params": 10, "activations": 20},
    }


def write_plan(tmp_path, records, **extra):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"world_size": 4, "memory_per_rank_role": records, **extra}))
    return str(path)


def test_parse_roles_from_file(tmp_path):
    path = write_plan(tmp_path, [record("pp0", [1, 0], 90 * MIB, 120 * MIB), record("pp1", [2, 3])])
    roles = mc.parse_roles(mc.load_json(path), 4)
    assert [(r.role, r.ranks, r.predicted, r.worst_case) for r in roles] == [
        ("pp0", [0, 1], 90 * MIB, 120 * MIB),
        ("pp1", [2, 3], 100 * MIB, 100 * MIB),
    ]
    assert (
        roles[0].breakdown == {"params": 10, "activations": 20}
        and roles[0].peak_at == "backward layers.0"
    )


@pytest.mark.parametrize(
    "records, message",
    [
        (
            [record("a", [0, 1]), record("b", [1, 2, 3])],
            "rank 1 is in two role records, 'a' and 'b'",
        ),
        ([record("a", [0, 1]), record("b", [3])], r"rank\(s\) 2 in no memory_per_rank_role record"),
        ([record("a", [0, 1, 2, 3, 4])], "rank 4 outside 0..3"),
        (
            [{k: v for k, v in record("a", [0, 1, 2, 3]).items() if k != "worst_case_peak_bytes"}],
            "'worst_case_peak_bytes' missing",
        ),
        (
            [{**record("a", [0, 1, 2, 3]), "predicted_peak_bytes": "big"}],
            "'predicted_peak_bytes' missing or not int",
        ),
        ([], "non-empty list"),
    ],
)
def test_parse_roles_errors(tmp_path, records, message):
    with pytest.raises(mc.CheckError, match=message):
        mc.parse_roles(mc.load_json(write_plan(tmp_path, records)), 4)


def test_plan_without_roles_and_unreadable_plan(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"world_size": 2, "memory_per_pp_rank": []}))
    with pytest.raises(mc.CheckError, match="no 'memory_per_rank_role'.*predates"):
        mc.parse_roles(mc.load_json(str(path)), 2)
    path.write_text("{not json")
    with pytest.raises(mc.CheckError, match="cannot read it as JSON"):
        mc.load_json(str(path))
    with pytest.raises(mc.CheckError, match="was not written"):
        mc.load_json(str(tmp_path / "missing.json"))


def test_plan_difference():
    units = [{"name": "layers.0", "reshard_after_forward": True}]
    dry = {"model_parts": [{"stage": 0, "fsdp_units": units}, {"stage": 1, "fsdp_units": units}]}
    assert mc.plan_difference(dry, {"model_parts": [{"stage": 1, "fsdp_units": units}]}) == ""
    other = [{"name": "layers.0", "reshard_after_forward": False}]
    assert "stage 0" in mc.plan_difference(
        dry, {"model_parts": [{"stage": 0, "fsdp_units": other}]}
    )
    assert "not in the dry run's" in mc.plan_difference(
        dry, {"model_parts": [{"stage": 2, "fsdp_units": units}]}
    )


# ---------------------------------------------------------------- rank files


def write_rank_files(dump, peaks_by_rank):
    os.makedirs(os.path.join(dump, "memory"), exist_ok=True)
    for r, peaks in enumerate(peaks_by_rank):
        with open(os.path.join(dump, "memory", f"rank{r}.jsonl"), "w") as f:
            for step, p in enumerate(peaks, 1):
                f.write(json.dumps({"step": step, "peak_allocated_bytes": p}) + "\n")


def test_rank_peak_skips_step_one(tmp_path):
    write_rank_files(str(tmp_path), [[900, 50, 70, 60], [10, 20]])
    assert mc.run_peaks(str(tmp_path), 2) == [70, 20]


def test_rank_file_errors(tmp_path):
    write_rank_files(str(tmp_path), [[100, 120]])
    with pytest.raises(mc.CheckError, match="no step >= 3"):
        mc.rank_peak(os.path.join(tmp_path, "memory", "rank0.jsonl"), first_step=3)
    with pytest.raises(mc.CheckError, match="rank1.jsonl was not written"):
        mc.run_peaks(str(tmp_path), 2)
    write_rank_files(str(tmp_path), [[100]])
    with pytest.raises(mc.CheckError, match="no step >= 2"):
        mc.rank_peak(os.path.join(tmp_path, "memory", "rank0.jsonl"))
    bad = tmp_path / "memory" / "rank0.jsonl"
    bad.write_text('{"step": 2}\n')
    with pytest.raises(mc.CheckError, match="line 1"):
        mc.rank_peak(str(bad))


# ---------------------------------------------------------------- arithmetic


def test_median_max_error_and_spread():
    roles = [mc.Role("pp0", [0, 1], 110, 200, "x"), mc.Role("pp1", [2], 90, 90, "y")]
    runs = [[100, 104, 80], [102, 96, 100], [101, 100, 90]]  # runs x ranks
    ranks = mc.rank_rows("job", runs, roles)
    assert [r.measured for r in ranks] == [101, 100, 90]  # medians
    assert [r.spread for r in ranks] == [2, 8, 20]  # max - min over the runs
    assert ranks[1].role == "pp0" and ranks[2].role == "pp1"
    assert ranks[0].error == pytest.approx((110 - 101) / 101)
    rows = mc.role_rows("job", ranks, roles)
    assert rows[0].measured == 101 and rows[0].spread == 8  # max of its ranks' medians / spreads
    assert rows[0].error == pytest.approx(9 / 101)
    assert rows[1].measured == 90 and rows[1].error == 0.0
    assert not rows[0].above_worst_case
    low = [mc.Role("pp0", [0, 1], 90, 95, "x"), mc.Role("pp1", [2], 80, 80, "y")]
    over = mc.role_rows("job", ranks, low, moe=True)
    assert over[0].above_worst_case and over[0].error < 0
    assert not over[1].above_worst_case  # worst == balanced (no EP): no routing bound to be above
    assert not mc.role_rows("job", ranks, low)[0].above_worst_case  # dense: no routing bound


def test_error_sign_and_zero_measured():
    assert mc.rel_error(110, 100) == pytest.approx(0.10)  # predicted too high: +
    assert mc.rel_error(90, 100) == pytest.approx(-0.10)
    with pytest.raises(mc.CheckError):
        mc.rel_error(1, 0)


def test_rank_rows_without_predictions_and_ragged_runs():
    rows = mc.rank_rows("job", [[5, 6], [7, 8]], None)
    assert [(r.role, r.predicted, r.error, r.measured) for r in rows] == [
        ("?", None, None, 6),
        ("?", None, None, 7),
    ]
    with pytest.raises(mc.CheckError):
        mc.rank_rows("job", [[5, 6], [7]], None)


def test_summary():
    def row(job, err):
        return mc.RoleRow(job, "r", [0], 1, 1, 1.0, 0, err)

    rows = [row("a", 0.05), row("b", -0.30), row("c", 0.10), row("d", -0.02)]
    s = mc.summarize(rows, 5, ["e"])
    assert s["worst_abs_error"] == pytest.approx(0.30) and s["worst_role"] == "b/r"
    assert s["median_abs_error"] == pytest.approx(0.075)
    assert s["roles_within"] == 3 and s["roles"] == 4
    line = mc.summary_line(s)
    assert "worst |error| 30.0% (b/r)" in line and "3/4 roles within +/-10%" in line
    assert "4/5 jobs ok, 1 failed: e" in line
    empty = mc.summarize([], 1, ["a"])
    assert "no role compared" in mc.summary_line(empty) and "1 failed: a" in mc.summary_line(empty)


def test_busiest_expert(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"step": 1, "loss": 8.0, "expert_load_max": 3.0},
                {"step": 2, "loss": 7.0, "expert_load_max": 1.25},
                {"step": 3, "loss": 6.0, "expert_load_max": 1.5},
                {"step": 3, "val_loss": 6.5},
            ]
        )
        + "\n"
    )
    assert mc.busiest_expert(str(path)) == 1.5
    path.write_text(json.dumps({"step": 2, "loss": 7.0}) + "\n")  # a dense model
    assert mc.busiest_expert(str(path)) is None
    assert mc.busiest_expert(str(tmp_path / "missing.jsonl")) is None


def test_from_json_round_trip(tmp_path, capsys):
    roles = [mc.Role("all", [0, 1], 110 * MIB, 130 * MIB, "backward", {"activations": 5})]
    ranks = mc.rank_rows("ds_a", [[100 * MIB, 100 * MIB]] * 3, roles)
    res = mc.JobResult(
        "ds_a", 2, "deepseek_v3", ["--x=1"], True, [], 3.0, ranks, [], roles, [], [1.3]
    )
    bad = mc.JobResult("llama_b", 2, "llama3", [], False, ["run 1 exit 1:\n    boom"], 1.0)
    data = {
        "runs_per_job": 3,
        "launcher": "fast",
        "summary": {"wall_s": 4.0},
        "jobs": [mc.asdict(res), mc.asdict(bad)],
    }
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(data))
    pairs = mc.results_from_json(json.loads(path.read_text()))
    assert (
        pairs[0][1].roles[0].error == pytest.approx(0.10)
        and pairs[0][1].roles[0].measured == 100 * MIB
    )
    assert mc.report(str(path), breakdown=True) == 1
    out = capsys.readouterr().out
    assert "error +10.00%" in out and "predicted: activations" in out and "boom" in out
    assert "1/1 roles within +/-10%; 1/2 jobs ok, 1 failed: llama_b" in out
