"""Multi-token prediction (--model.mtp_depth=1) in multi-rank layouts vs 1 rank: `loss`,
`mtp_loss` and the gradient norm per step within the suite's fp32 tolerance (mtp_parity.py)."""

import mtp_parity
import pytest

STEPS = 3
RTOL = 1e-4  # parity_cases.Case's default, which every fp32 DeepSeek-V3 case uses


def _check(layouts: list[str], tmp_path) -> None:
    rows = mtp_parity.parity(layouts, STEPS, str(tmp_path))  # one 1-rank reference for all
    for layout in layouts:
        ours = [r for r in rows if r[0] == layout]
        assert len(ours) == STEPS
        for name, step, loss, mtp_loss, *diffs in ours:
            assert mtp_loss > 0, (step, mtp_loss)
            assert max(diffs) <= RTOL, (name, step, loss, mtp_loss, diffs)


def test_mtp_fsdp2_ep2_zero_bubble_pipeline_and_compiled_tp_ep_match_one_rank(tmp_path):
    # PP: the MTP tokens' embeddings travel from the first stage to the last with the hidden
    # state. Compiled TP 2 + EP 2: the first block's input is a strided slice of the one
    # embedding call (docs/compile.md, static shapes). One 1-rank reference for the three.
    _check(["fsdp2+ep2", "pp2_ZBVZeroBubble", "tp2+ep2_compile"], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [
        "tp2+ep2",
        "cp2+ep2",
        "simple_fsdp+tp2+ep2",
        "fsdp2+ep2_ac_op_compile",
        "pp2_DualPipeV+ep2",
        "pp2_1F1B+fsdp2",
    ],
)
def test_mtp_layout_matches_one_rank(layout, tmp_path):
    _check([layout], tmp_path)
