"""The runs of the parity cases (parity_cases.py) that several test files compare against: each case, and
each 1-rank reference (reference*), run at most once per session; its losses, gradient norms,
the collective counts of its last step and the expert loads per step kept here. Used by
test_parity_suite.py (every case against its reference) and test_checkpoint.py (a straight
run against the reference)."""

import json

import parity_cases
import run_tests

CASES = parity_cases.BY_NAME
REFERENCES = parity_cases.REFERENCES

LOSSES: dict[str, list[float]] = {}
GRAD_NORMS: dict[str, list[float]] = {}
COMM: dict[str, dict] = {}
LOADS: dict[str, list] = {}  # MoE: (min, max) tokens per expert over the mean, per step
AUX: dict[str, list] = {}  # MoE with a balance loss: its value per step


def losses(name: str, tmp_path_factory) -> list[float]:
    """Run a case once per session (reference* are the 1-rank runs) and keep its losses."""
    if name not in LOSSES:
        if name in REFERENCES:
            (model, dtype, mask), ngpu, launcher = REFERENCES[name], 1, None
            overrides = parity_cases.reference_overrides(mask)
        else:
            c = CASES[name]
            ngpu, overrides, model, dtype, launcher = (
                c.ngpu,
                c.overrides,
                c.model,
                c.dtype,
                c.launcher,
            )
        dump = str(tmp_path_factory.mktemp(name.replace("+", "_")))
        rc, _, log = run_tests.run(
            ngpu, overrides, dump, model=model, dtype=dtype, launcher=launcher
        )
        assert rc == 0, log[-3000:]
        LOSSES[name] = run_tests.read_losses(dump)
        GRAD_NORMS[name] = run_tests.read_grad_norms(dump)
        with open(f"{dump}/metrics.jsonl") as f:
            records = [json.loads(line) for line in f if line.strip()]
        COMM[name] = records[-1].get("comm", {})
        LOADS[name] = [(r.get("expert_load_min"), r.get("expert_load_max")) for r in records]
        AUX[name] = [r["aux_loss"] for r in records if "aux_loss" in r]
    return LOSSES[name]


def comm(name: str, tmp_path_factory) -> dict:
    """The collective counts of a case's last step (its dump is kept by losses)."""
    losses(name, tmp_path_factory)
    return COMM[name]
