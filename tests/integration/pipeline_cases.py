"""Parity cases of upstream's pipeline split (distributed/pipeline_layout.py): uneven stages,
stages with no block, the split given per stage, layers_per_stage, CSV schedules, and the
schedules of upstream's suite at its stage counts. parity_cases.CASES takes them in (and
MODELS: the 6-block model, upstream's debugmodel, for 8 stages on 4 ranks).

Stages per case (blocks; E = the embedding, O = norm + output):
- pp_looped_zero_bubble_8: 6 blocks, pp 4 x 2: E | 0 | 1 | 2 | 3 | 4 | 5 | O (upstream's
  pp_looped_zero_bubble), pp_looped_1f1b_lps1 the same by layers_per_stage=1;
- pp_zbv_6: 6 blocks, pp 2 x 2 (V): E 0 | 1 2 | 3 4 | 5 O (pp_zbv);
- pp_dp_1f1b_lps4: 6 blocks, layers_per_stage 4: E 0 1 2 | 3 4 5 O (pp_dp_1f1b);
- pp_custom_csv: 4 blocks, 4 stages from the CSV's placement: E 0 | 1 2 | 3 | O;
- pp_module_fqns: E 0 | 1 2 3 O; pp_first_less_2: E 0 | 1 2 3 O by the weights.
"""

from parity_cases import DS, PP, Case

LLAMA6 = "llama3_6"  # upstream's llama3 debugmodel (6 blocks), for 8 stages
MODELS = {LLAMA6: ("llama3", "debugmodel", [])}

PP4 = "--parallelism.pipeline_parallel_degree=4"
CSV = "--parallelism.pipeline_parallel_schedule_csv=tests/assets/custom_schedule.csv"


def _schedule(name: str) -> str:
    return f"--parallelism.pipeline_parallel_schedule={name}"


CASES = [
    Case(
        "pp_looped_zero_bubble_8",
        4,
        [PP4, _schedule("InterleavedZeroBubble"), "--training.local_batch_size=8"],
        model=LLAMA6,
        slow=True,
    ),
    Case(
        "pp_looped_1f1b_lps1",
        4,
        [
            PP4,
            _schedule("Interleaved1F1B"),
            "--parallelism.pipeline_parallel_layers_per_stage=1",
            "--training.local_batch_size=8",
        ],
        model=LLAMA6,
        slow=True,
    ),
    Case(
        "pp_zbv_6",
        2,
        [PP, _schedule("ZBVZeroBubble"), "--training.local_batch_size=8"],
        model=LLAMA6,
        slow=True,
    ),
    Case(
        "pp_dp_1f1b_lps4",
        4,
        [
            PP,
            _schedule("1F1B"),
            "--parallelism.pipeline_parallel_layers_per_stage=4",
            "--training.local_batch_size=4",
        ],
        model=LLAMA6,
        slow=True,
    ),
    Case(
        "deepseek_pp_dualpipev_ep",
        4,
        [
            PP,
            _schedule("DualPipeV"),
            "--parallelism.expert_parallel_degree=2",
            "--activation_checkpoint.mode=none",
            "--training.local_batch_size=4",
        ],
        model=DS,
        slow=True,
    ),
    Case(
        "pp_custom_csv",
        2,
        [PP, _schedule("PipelineScheduleMulti"), CSV, "--training.local_batch_size=8"],
    ),
    Case(
        "pp_module_fqns",
        2,
        [
            PP,
            '--parallelism.module_fqns_per_model_part=[["tok_embeddings", "layers.0"],'
            ' ["layers.1", "layers.2", "layers.3", "norm", "output"]]',
            "--training.local_batch_size=8",
        ],
    ),
    Case(
        "pp_first_less_2",
        2,
        [
            PP,
            "--parallelism.pipeline_parallel_first_stage_less_layers=2",
            "--parallelism.pipeline_parallel_last_stage_less_layers=0",
            "--training.local_batch_size=8",
        ],
        slow=True,
    ),
]
