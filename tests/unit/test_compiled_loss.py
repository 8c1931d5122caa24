"""compile.components = ["loss"]: the cross entropy (and multi-token prediction's losses) run
compiled, one graph each, counted under "loss" in compile_stats; with aot_eager the losses and
the gradients of the logits equal eager's bitwise (the same kernels run)."""

import torch

from torchtitan.distributed.compile import compile_stats, reset_compile_stats
from torchtitan.training.loss import Loss


def _terms(loss: Loss, logits: torch.Tensor, labels: torch.Tensor):
    x = logits.detach().clone().requires_grad_(True)
    main, mtp = loss.terms(x, labels)
    total = loss.objective(main, mtp, None)
    total.backward()
    return main.detach(), None if mtp is None else mtp.detach(), x.grad


def test_compiled_loss_equals_eager_bitwise_and_is_counted_as_loss():
    torch.manual_seed(0)
    torch._dynamo.reset()  # another test may have compiled the same functions
    reset_compile_stats()
    for depth in (0, 2):  # the main cross entropy alone; with two MTP depths
        seq = 16
        logits = torch.randn(2, (1 + depth) * seq, 97)
        labels = torch.randint(0, 97, (2, (1 + depth) * seq))
        eager = Loss(4, mtp_depth=depth, mtp_weight=0.3, seq_len=seq)
        compiled = Loss(4, mtp_depth=depth, mtp_weight=0.3, seq_len=seq)
        compiled.compile("aot_eager")
        for a, b in zip(_terms(eager, logits, labels), _terms(compiled, logits, labels)):
            assert (a is None and b is None) or torch.equal(a, b)
    stats = compile_stats()
    assert set(stats["blocks"]) == {"loss"}, stats["blocks"]
    assert stats["blocks"]["loss"]["compiles"] == 2 and stats["graph_breaks"] == 0
    reset_compile_stats()
