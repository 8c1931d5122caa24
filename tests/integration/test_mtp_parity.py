"""Multi-token prediction (--model.mtp_depth=1) in multi-rank layouts vs 1 rank: `loss`,
`mtp_loss` and the gradient norm per step within the suite's fp32 tolerance (mtp_parity.py)."""

import mtp_parity
import pytest

STEPS = 3
RTOL = 1e-4  # run_tests.Case's default, which every fp32 DeepSeek-V3 case uses


def _check(layouts: list[str], tmp_path) -> None:
    rows = mtp_parity.parity(layouts, STEPS, str(tmp_path))  # one 1-rank reference for all
    for layout in layouts:
        ours = [r for r in rows if r[0] == layout]
        assert len(ours) == STEPS
        for name, step, loss, mtp_loss, *diffs in ours:
            assert mtp_loss > 0, (step, mtp_loss)
            assert max(diffs) <= RTOL, (name, step, loss, mtp_loss, diffs)


def test_mtp_fsdp2_ep2_and_zero_bubble_pipeline_match_one_rank(tmp_path):
    # PP: the MTP tokens' embeddings travel from the first stage to the last with the hidden state
    _check(["fsdp2+ep2", "pp2_ZBVZeroBubble"], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [
        "tp2+ep2",
        "tp2+ep2_compile",
        "cp2+ep2",
        "simple_fsdp+tp2+ep2",
        "fsdp2+ep2_ac_op_compile",
        "pp2_DualPipeV+ep2",
        "pp2_1F1B+fsdp2",
    ],
)
def test_mtp_layout_matches_one_rank(layout, tmp_path):
    _check([layout], tmp_path)
