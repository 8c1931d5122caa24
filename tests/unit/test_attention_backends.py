"""The flavors' attention kernels (models/common/attn_backend.py, attention.py): upstream's
flex / varlen flavors exist with the shapes of each family's debug model, they imply the
block-causal mask (the check refuses causal), on CPU they attend through SDPA with the same
document-causal mask and say so once, and the CUDA paths' own code (the BlockMask, the varlen
packing) computes block-causal attention, checked here where torch lets it run on CPU."""

import dataclasses
import logging

import pytest
import torch
import torch.nn.functional as F
from config_helpers import cfg_of, config_error
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from torchtitan.checks import load_config
from torchtitan.distributed.context_parallel import ContextParallel
from torchtitan.models.common import attention
from torchtitan.models.common.attention import attend, attention_inputs, document_ids
from torchtitan.models.common.attn_backend import run_attn_mask
from torchtitan.models.flavors import flavors_of, model_args
from torchtitan.models.train_spec import get_train_spec

# eager flex_attention (CPU, forward only) warns that it is unfused: expected here
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

VOCAB, SEQ, BOS = 256, 64, 0
# family -> {flavor: backend}, as upstream v0.2.2 (73a0e69) names them; qwen3 has none there
KERNEL_FLAVORS = {
    "llama3": {
        "debugmodel_flex_attn": ("debugmodel", "flex"),
        "debugmodel_varlen_attn": ("debugmodel", "varlen"),
        "8B_flex": ("8B", "flex"),
        "8B_varlen": ("8B", "varlen"),
    },
    "deepseek_v3": {"debugmodel_flex_attn": ("debugmodel", "flex")},
    "qwen3": {},
}
CPU_NOTE = {
    "flex": "note: attn_backend=flex cannot train on CPU in torch 2.13 (flex_attention:"
    ' "FlexAttention does not support backward on CPU"); attending through SDPA with the same'
    " document-causal mask",
    "varlen": "note: attn_backend=varlen cannot train on CPU in torch 2.13 (varlen_attn:"
    " \"Could not run 'aten::_flash_attention_forward' with arguments from the 'CPU' backend\");"
    " attending through SDPA with the same document-causal mask",
}


def tokens_with_documents(bsz: int, seq: int, seed: int) -> torch.Tensor:
    """Random tokens with a BOS at a few fixed places per row (row 0 starts mid-document)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (bsz, seq), generator=g)
    tokens[0, [5, 20, 21, 40]] = BOS
    tokens[1:, [0, 33]] = BOS
    return tokens


def block_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    seq = doc_ids.shape[1]
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (same & torch.ones(seq, seq, dtype=torch.bool).tril()).unsqueeze(1)


def qkv(bsz=2, heads=4, seq=SEQ, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(bsz, heads, seq, dim, generator=g) for _ in range(3)]


@pytest.fixture
def fresh_notes():
    attention._note_once.cache_clear()
    yield
    attention._note_once.cache_clear()


# ------------------------------------------------------------------------- the flavors


@pytest.mark.parametrize("family", sorted(KERNEL_FLAVORS))
def test_kernel_flavors_exist_with_the_base_shapes(family):
    flavors = flavors_of(family)
    kernels = {name: a.attn_backend for name, a in flavors.items() if a.attn_backend != "sdpa"}
    assert kernels == {name: backend for name, (_, backend) in KERNEL_FLAVORS[family].items()}
    for name, (base, _) in KERNEL_FLAVORS[family].items():
        # the same shapes as the base flavor: only the kernel differs
        assert dataclasses.replace(flavors[name], attn_backend="sdpa") == flavors[base]


def test_run_attn_mask():
    flex = flavors_of("llama3")["debugmodel_flex_attn"]
    sdpa = flavors_of("llama3")["debugmodel"]
    assert run_attn_mask("auto", flex) == "block_causal"
    assert run_attn_mask("auto", sdpa) == "causal"
    assert run_attn_mask("block_causal", sdpa) == "block_causal"
    assert run_attn_mask("causal", object()) == "causal"  # args without the field: sdpa


# ------------------------------------------------------------------------- the checks


@pytest.mark.parametrize(
    "family,flavor,backend",
    [
        ("llama3", "debugmodel_flex_attn", "flex"),
        ("llama3", "debugmodel_varlen_attn", "varlen"),
        ("deepseek_v3", "debugmodel_flex_attn", "flex"),
    ],
)
def test_check_refuses_causal_with_a_kernel_flavor(family, flavor, backend):
    argv = [f"--model.name={family}", f"--model.flavor={flavor}"]
    assert config_error([*argv, "--model.attn_mask=causal"]) == (
        f"--model.attn_mask=causal: flavor {flavor} attends with {backend} attention within"
        f" documents; set --model.attn_mask=block_causal or pick a flavor without {backend}"
    )
    load_config([*argv, "--model.attn_mask=block_causal"], 1)  # accepted, model states included


def test_check_refuses_an_unknown_backend(monkeypatch):
    flavors = flavors_of("llama3")
    monkeypatch.setitem(
        flavors, "debugmodel", dataclasses.replace(flavors["debugmodel"], attn_backend="flash")
    )
    assert config_error(["--model.flavor=debugmodel"]) == (
        "--model.flavor=debugmodel: attn_backend 'flash' of llama3 is not one of sdpa, flex,"
        " varlen; fix the flavor's args"
    )


def test_the_check_entry_point_accepts_the_flavors_with_their_mask():
    from torchtitan.checks.job import check_job

    for family, flavors in KERNEL_FLAVORS.items():
        for flavor in flavors:
            if flavor.startswith("8B"):
                continue  # a single CPU rank cannot hold 8B's model states
            cfg = cfg_of(
                [
                    f"--model.name={family}",
                    f"--model.flavor={flavor}",
                    "--model.attn_mask=block_causal",
                ]
            )
            check_job(cfg, 4)


# ------------------------------------------------------------------------- CPU: SDPA, one note


@pytest.mark.parametrize("backend", ["flex", "varlen"])
def test_cpu_attends_through_sdpa_equal_to_flex_forward(backend, fresh_notes):
    q, k, v = qkv()
    doc_ids = document_ids(tokens_with_documents(2, SEQ, 1), BOS)
    inputs = attention_inputs(SEQ, torch.zeros(SEQ, 8), doc_ids, backend=backend)
    assert inputs.kernel == "sdpa" and inputs.mask is not None
    ours = attend(q, k, v, inputs)

    def same_document(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

    mask = create_block_mask(same_document, 2, None, SEQ, SEQ, device="cpu")
    reference = flex_attention(q, k, v, block_mask=mask)  # CPU: forward only, no gradients
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)
    # and the documents are really apart: causal over the whole window differs
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (causal - reference).abs().max() > 0.1


@pytest.mark.parametrize("backend", ["flex", "varlen"])
def test_cpu_note_is_logged_once(backend, fresh_notes, caplog):
    doc_ids = document_ids(tokens_with_documents(2, SEQ, 1), BOS)
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        for _ in range(3):
            attention_inputs(SEQ, torch.zeros(SEQ, 8), doc_ids, backend=backend)
        attention_inputs(SEQ, torch.zeros(SEQ, 8), doc_ids)  # sdpa: nothing to say
    assert [r.getMessage() for r in caplog.records] == [CPU_NOTE[backend]]


def test_no_note_in_the_memory_simulation_or_for_sdpa(fresh_notes, caplog):
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        with FakeTensorMode():  # what planning/simulate runs a step on
            inputs = attention_inputs(SEQ, torch.zeros(SEQ, 8), backend="flex")
        attention_inputs(SEQ, torch.zeros(SEQ, 8), backend="sdpa")
    assert inputs.kernel == "sdpa"
    assert caplog.records == []


def test_context_parallel_note(fresh_notes, caplog):
    cp = ContextParallel(group=None, rank=0, degree=2)
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        inputs = attention_inputs(SEQ // 2, torch.zeros(SEQ, 8), cp=cp, backend="varlen")
    assert inputs.cp is cp and inputs.kernel == "sdpa"
    assert [r.getMessage() for r in caplog.records] == [
        "note: attn_backend=varlen under context parallel: the ring attends per chunk through"
        " SDPA with the same document-causal masks"
    ]


# ------------------------------------------------------------------------- the CUDA paths' code


@pytest.mark.parametrize("with_documents", [True, False])
def test_document_block_mask_is_block_causal(with_documents):
    q, k, v = qkv(seed=2)
    doc_ids = document_ids(tokens_with_documents(2, SEQ, 3), BOS) if with_documents else None
    mask = attention.document_block_mask(doc_ids, SEQ, torch.device("cpu"))
    ours = attention.flex_attend(q, k, v, mask, scale=0.3)
    if with_documents:
        expected = F.scaled_dot_product_attention(
            q, k, v, attn_mask=block_causal_mask(doc_ids), scale=0.3
        )
    else:
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)


def test_document_lengths():
    doc_ids = torch.tensor([[0, 0, 1, 1, 1, 2], [1, 1, 1, 1, 1, 1]], dtype=torch.int32)
    cu, longest = attention.document_lengths(doc_ids)
    assert cu.dtype == torch.int32
    assert cu.tolist() == [0, 2, 5, 6, 12]  # the second row starts a document of its own
    assert longest == 6


def _reference_varlen(seen):
    """varlen_attn's semantics on CPU: causal SDPA within each packed sequence."""

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        seen.append((q.dtype, cu_q.tolist(), max_q, window_size))
        assert cu_q is cu_k and max_q == max_k and window_size == (-1, 0)
        out = q.new_empty(*q.shape[:2], v.shape[-1])
        for start, end in zip(cu_q.tolist(), cu_q.tolist()[1:]):
            part = [t[start:end].transpose(0, 1).float() for t in (q, k, v)]
            o = F.scaled_dot_product_attention(*part, is_causal=True, scale=scale)
            out[start:end] = o.transpose(0, 1).to(q.dtype)
        return out

    return varlen


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_varlen_packing_is_block_causal(dtype, monkeypatch, fresh_notes, caplog):
    seen = []
    monkeypatch.setattr(attention, "_varlen", _reference_varlen(seen))
    q, k, v = (t.to(dtype) for t in qkv(seed=4))
    v = v[..., :8]  # a value width of its own, as DeepSeek-V3's
    doc_ids = document_ids(tokens_with_documents(2, SEQ, 5), BOS)
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        ours = attention.varlen_attend(q, k, v, attention.document_lengths(doc_ids), scale=0.25)
    assert ours.dtype == dtype and ours.shape == (2, 4, SEQ, 8)
    # row 0: documents at 0, 5, 20, 21, 40; row 1 (starting at 64): 0, 33
    assert seen == [
        (torch.bfloat16, [0, 5, 20, 21, 40, 64, 97, 128], 33, (-1, 0))
    ]  # longest: 64..97
    low = [t.to(torch.bfloat16).float() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(
        *low, attn_mask=block_causal_mask(doc_ids), scale=0.25
    )
    torch.testing.assert_close(ours.float(), expected, atol=1e-2, rtol=0)
    notes = [r.getMessage() for r in caplog.records]
    assert notes == (
        []
        if dtype == torch.bfloat16
        else [
            "note: attn_backend=varlen: the flash kernel takes bf16 / fp16; fp32 q, k, v are"
            " cast to bf16 for it"
        ]
    )


def test_varlen_without_documents_is_causal_per_row(monkeypatch):
    seen = []
    monkeypatch.setattr(attention, "_varlen", _reference_varlen(seen))
    q, k, v = (t.to(torch.bfloat16) for t in qkv(seed=6))
    ours = attention.varlen_attend(q, k, v, None)
    assert seen[0][1:3] == ([0, SEQ, 2 * SEQ], SEQ)
    expected = F.scaled_dot_product_attention(*(t.float() for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(ours.float(), expected, atol=1e-2, rtol=0)


# ------------------------------------------------------------------------- the flavors train


def _model(family: str, flavor: str):
    args = model_args(family, flavor, vocab_size=VOCAB, seq_len=SEQ)
    with torch.device("meta"):
        model = get_train_spec(family).model_cls(args)
    model.to_empty(device="cpu")
    model.init_weights(0, torch.device("cpu"))
    return model


def _step(model, tokens, labels, doc_ids):
    logits = model(tokens, doc_ids=doc_ids)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "family,flavor",
    [
        ("llama3", "debugmodel_flex_attn"),
        ("llama3", "debugmodel_varlen_attn"),
        ("deepseek_v3", "debugmodel_flex_attn"),
    ],
)
def test_kernel_flavors_train_as_debugmodel_with_documents(family, flavor, fresh_notes):
    """One forward + backward on CPU: the loss bitwise, every gradient bitwise (llama3) or
    to 1e-9 (DeepSeek-V3's MoE: two runs of the same model differ by ~1e-11) those of the
    debug model under the block-causal mask, which differ from causal attention's."""
    tokens = tokens_with_documents(2, SEQ, 7)
    labels = torch.roll(tokens, -1, dims=1)
    doc_ids = document_ids(tokens, BOS)
    loss, grads = _step(_model(family, flavor), tokens, labels, doc_ids)
    base_loss, base_grads = _step(_model(family, "debugmodel"), tokens, labels, doc_ids)
    causal_loss, _ = _step(_model(family, "debugmodel"), tokens, labels, None)
    assert torch.isfinite(loss) and loss.item() > 0
    assert torch.equal(loss, base_loss)
    assert grads.keys() == base_grads.keys()
    for name, g in grads.items():
        assert g is not None, name
        if family == "llama3":
            assert torch.equal(g, base_grads[name]), name
        else:  # the MoE backward's accumulation order varies run to run (~1e-11 here)
            torch.testing.assert_close(g, base_grads[name], atol=1e-9, rtol=1e-6, msg=name)
    assert not torch.equal(loss, causal_loss)
