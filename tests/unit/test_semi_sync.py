"""Semi-synchronous replica groups (training/semi_sync.py) in one process: two replicas, each a
thread with its own model, batches and AdamW (the trainer's PartOptimizers, whose step hooks
torchft's LocalSGD / DiLoCo use), meeting in a stand-in torchft manager that really averages
their all-reduces; against the algorithm written out by hand here on the same batches:
LocalSGD, DiLoCo, Streaming DiLoCo (2 fragments, with and without a sync delay). Also the
fragments' split and its errors, the optimizers' step hooks, and the checkpoint state."""

import copy
import threading
from types import SimpleNamespace as NS

import pytest
import torch
from config_helpers import cfg_of
from torch import nn

from torchtitan.config import ConfigError
from torchtitan.training.optimizer import PartOptimizers
from torchtitan.training.semi_sync import SemiSyncState, SyncSchedule, fragments

STEPS, GROUPS, DIM = 9, 2, 8


class Net(nn.Module):
    """A transformer's outline: an embedding, blocks in `layers`, a norm and a head."""

    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Linear(DIM, DIM)
        self.layers = nn.ModuleDict({str(i): nn.Linear(DIM, DIM) for i in range(4)})
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, 1)

    def forward(self, x):
        x = self.tok_embeddings(x)
        for layer in self.layers.values():
            x = torch.tanh(layer(x))
        return self.output(self.norm(x))


class Meeting:
    """What the replicas share: their all-reduces, summed in order and divided (torchft's
    AVG: SUM, then / participants) once both have sent theirs."""

    def __init__(self):
        self.barrier = threading.Barrier(GROUPS)
        self.sums: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()


class Manager:
    """One replica's torchft Manager as LocalSGD / DiLoCo and SyncSchedule use it."""

    _use_async_quorum = False

    def __init__(self, meeting: Meeting, g: int):
        self.meeting, self.g, self.calls, self.step = meeting, g, 0, 0

    def allreduce(self, tensor, should_quantize=False, reduce_op=None):
        key, self.calls = self.calls, self.calls + 1
        m = self.meeting
        m.barrier.wait()
        for g in range(GROUPS):  # replica 0's, then 1's: summed in one order
            if g == self.g:
                with m.lock:
                    m.sums[key] = tensor.clone() if key not in m.sums else m.sums[key] + tensor
            m.barrier.wait()
        tensor.copy_(m.sums[key] / GROUPS)
        m.barrier.wait()
        fut = torch.futures.Future()
        fut.set_result([tensor])
        return NS(wait=lambda *a: True, get_future=lambda: fut)

    def start_quorum(self, *a, **k):
        self.meeting.barrier.wait()

    def should_commit(self, *a, **k):
        self.meeting.barrier.wait()
        self.step += 1
        return True

    def current_step(self):
        return self.step

    def batches_committed(self):
        return 0

    def load_state_dict(self, state):
        self.step = state["step"]

    def register_state_dict_fn(self, *a):
        pass

    def allow_state_dict_read(self):
        pass

    def disallow_state_dict_read(self):
        pass


def _section(method: str, sync: int, fragments_: int = 1, delay: int = 0):
    return NS(
        semi_sync_method=method,
        sync_steps=sync,
        num_fragments=fragments_,
        module_fqns_per_model_fragment=[],
        should_quantize=False,
        fragment_sync_delay=delay,
        fragment_update_alpha=0.0,
        outer_lr=0.7,
        outer_momentum=0.9,
        outer_nesterov=True,
    )


def _batches():
    gen = torch.Generator().manual_seed(1)
    return [
        [
            (torch.randn(4, DIM, generator=gen), torch.randn(4, 1, generator=gen))
            for _ in range(STEPS)
        ]
        for _ in range(GROUPS)
    ]


def _optimizers(model):
    cfg = cfg_of(
        ["--optimizer.lr=0.01", "--lr_scheduler.warmup_steps=0", "--lr_scheduler.decay_ratio=0"]
    )
    return PartOptimizers([model], cfg.optimizer, STEPS, cfg.lr_scheduler)


def _loss(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def _run_torchft(section, start: Net, data) -> list[list[float]]:
    meeting, losses, errors = Meeting(), [[] for _ in range(GROUPS)], []

    def replica(g: int) -> None:
        try:
            model, state = copy.deepcopy(start), NS(step=0)
            opt = _optimizers(model)
            schedule = SyncSchedule(section, Manager(meeting, g), [model], opt, state)
            for step in range(1, STEPS + 1):
                loss = _loss(model, data[g][step - 1])
                loss.backward()
                losses[g].append(loss.item())
                opt.step()
                model.zero_grad(set_to_none=True)
                state.step = step
            schedule.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            meeting.barrier.abort()

    threads = [threading.Thread(target=replica, args=(g,)) for g in range(GROUPS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return losses


def _run_reference(section, start: Net, data) -> list[list[float]]:
    """By hand: each replica's AdamW steps; every sync (a fragment's, in turn, every
    sync_steps / fragments steps; prepared `delay` steps before) the mean of the weights, or
    the mean pseudo-gradient (global - local, at preparation) stepping the global weights
    with Nesterov SGD (buf = m buf + d, the first buf = d; global -= lr (d + m buf))."""
    models = [copy.deepcopy(start) for _ in range(GROUPS)]
    opts = [_optimizers(m) for m in models]
    params = [list(m.parameters()) for m in models]
    frags = fragments([models[0]], section)  # the split, by position in the parameter list
    index = {id(p): i for i, p in enumerate(params[0])}
    parts = [[index[id(p)] for p in f.parameters()] for f in frags]
    if section.semi_sync_method == "local_sgd":
        parts = [list(range(len(params[0])))]
    period = section.sync_steps // len(parts)
    glob = [p.detach().clone() for p in params[0]]
    momentum: dict[int, torch.Tensor] = {}
    pending = None  # (fragment, mean pseudo-gradient) prepared, not yet applied
    losses = [[] for _ in range(GROUPS)]
    for step in range(1, STEPS + 1):
        for g in range(GROUPS):
            loss = _loss(models[g], data[g][step - 1])
            loss.backward()
            losses[g].append(loss.item())
            opts[g].step()
            models[g].zero_grad(set_to_none=True)
        k = (step - 1) // period  # the period this step is in
        frag = parts[k % len(parts)]
        with torch.no_grad():
            if step % period == period - section.fragment_sync_delay or (
                step % period == 0 and section.fragment_sync_delay == 0
            ):
                if section.semi_sync_method == "local_sgd":
                    pending = (
                        frag,
                        [sum(params[g][i] for g in range(GROUPS)) / GROUPS for i in frag],
                    )
                else:
                    pending = (
                        frag,
                        [sum(glob[i] - params[g][i] for g in range(GROUPS)) / GROUPS for i in frag],
                    )
            if step % period == 0:
                frag, values = pending
                for i, v in zip(frag, values):
                    if section.semi_sync_method == "local_sgd":
                        new = v
                    else:
                        momentum[i] = v.clone() if i not in momentum else 0.9 * momentum[i] + v
                        glob[i] = glob[i] - 0.7 * (v + 0.9 * momentum[i])
                        new = glob[i]
                    for g in range(GROUPS):
                        params[g][i].copy_(new)
    return losses


@pytest.mark.parametrize(
    "section",
    [
        _section("local_sgd", 3),
        _section("diloco", 3),
        _section("diloco", 4, fragments_=2),
        _section("diloco", 6, fragments_=2, delay=1),
    ],
    ids=["local_sgd", "diloco", "streaming_diloco", "streaming_diloco_delay"],
)
def test_torchfts_semi_sync_in_the_trainers_hooks_equals_the_hand_reference(section):
    torch.manual_seed(0)
    start, data = Net(), _batches()
    got = _run_torchft(section, start, data)
    want = _run_reference(section, start, data)
    for g in range(GROUPS):
        for s in range(STEPS):
            assert abs(got[g][s] - want[g][s]) <= 1e-6, (g, s + 1, got[g], want[g])
    # the two replicas trained apart between syncs (their own batches)
    assert got[0][0] != got[1][0]


def test_without_the_syncs_the_reference_would_differ():
    """The comparison can fail: DiLoCo's syncs change the losses after the first one."""
    torch.manual_seed(0)
    start, data = Net(), _batches()
    diloco = _run_reference(_section("diloco", 3), start, data)
    alone = _run_reference(_section("local_sgd", 10**6), start, data)
    assert diloco[0][:3] == alone[0][:3]
    assert all(abs(a - b) > 1e-6 for a, b in zip(diloco[0][4:], alone[0][4:]))


def test_fragments_split_the_blocks_and_cover_every_parameter():
    net = Net()
    one = fragments([net], _section("diloco", 4))
    assert [len(list(f.parameters())) for f in one] == [len(list(net.parameters()))]
    two = fragments([net], _section("diloco", 4, fragments_=2))
    # the embedding with the first half of the blocks, the norm and head with the second
    assert list(two[0]) == [net.tok_embeddings, net.layers["0"], net.layers["1"]]
    assert list(two[1]) == [net.layers["2"], net.layers["3"], net.norm, net.output]
    named = _section("diloco", 4, fragments_=2)
    named.module_fqns_per_model_fragment = [
        ["tok_embeddings", "layers.0"],
        ["layers.1", "layers.2", "layers.3", "norm", "output"],
    ]
    assert list(fragments([net], named)[0]) == [net.tok_embeddings, net.layers["0"]]


@pytest.mark.parametrize(
    "fqns, n, expected",
    [
        (
            [["tok_embeddings"], ["layers.9"]],
            2,
            "--fault_tolerance.module_fqns_per_model_fragment: no module named 'layers.9' on"
            " this rank's model; name top-level modules (e.g. tok_embeddings, layers.0, norm,"
            " output)",
        ),
        (
            [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]],
            2,
            "--fault_tolerance.module_fqns_per_model_fragment: 4 parameters in no fragment"
            " (e.g. layers.2.weight); name every top-level module in one fragment",
        ),
        (
            [["tok_embeddings", "layers"], ["layers.0", "norm", "output"]],
            2,
            "--fault_tolerance.module_fqns_per_model_fragment: fragments 0 and 1 share"
            " parameters; give each module to one fragment",
        ),
        (
            [],
            5,
            "--fault_tolerance.num_fragments=5: this rank holds 4 transformer blocks; use at"
            " most 4 fragments, or name them in --fault_tolerance.module_fqns_per_model_fragment",
        ),
    ],
)
def test_bad_fragments_are_one_line(fqns, n, expected):
    section = _section("diloco", 10, fragments_=n)
    section.module_fqns_per_model_fragment = fqns
    with pytest.raises(ConfigError) as e:
        fragments([Net()], section)
    assert str(e.value) == expected


def test_the_optimizers_step_hooks_run_around_the_update_before_the_schedule():
    model = Net()
    opt = _optimizers(model)
    seen = []
    w = model.output.weight
    before = w.detach().clone()
    opt.register_step_pre_hook(lambda o, a, k: seen.append(("pre", torch.equal(w, before))))
    handle = opt.register_step_post_hook(
        lambda o, a, k: seen.append(("post", torch.equal(w, before), opt.schedulers[0].last_epoch))
    )
    _loss(model, _batches()[0][0]).backward()
    opt.step()
    assert seen == [("pre", True), ("post", False, 0)]  # after the update, before the schedule
    assert opt.schedulers[0].last_epoch == 1
    handle.remove()
    opt.step()
    assert len(seen) == 3


def test_the_checkpoint_state_holds_dilocos_global_weights_and_momentum_by_name():
    """Saved: the global copy and outer momentum under each parameter's name; loaded before
    the wrapper exists and applied when it is attached."""
    torch.manual_seed(0)
    net = Net()
    meeting = Meeting()
    meeting.barrier = threading.Barrier(1)
    opt = _optimizers(net)
    schedule = SyncSchedule(_section("diloco", 3), Manager(meeting, 0), [net], opt, NS(step=0))
    state = SemiSyncState([net])
    state.attach(schedule.wrapper)
    saved = state.state_dict()
    assert sorted(saved) == sorted(
        f"{kind}.{n}" for kind in ("global", "momentum") for n, _ in net.named_parameters()
    )
    assert torch.equal(saved["global.output.weight"], net.output.weight)
    changed = {k: v + 1 for k, v in saved.items()}
    fresh = SemiSyncState([net])
    template = fresh.state_dict()  # before the wrapper: zeros to load into
    assert all(not t.any() for t in template.values())
    fresh.load_state_dict(changed)
    fresh.attach(schedule.wrapper)
    again = fresh.state_dict()
    assert all(torch.equal(again[k], changed[k]) for k in changed)
    schedule.close()
