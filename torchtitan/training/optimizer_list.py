"""A model part's several torch optimizers as one (optimizer.py's in-backward AdamWs, muon.py's
Muon and AdamW)."""


class OptimizerList(list):
    """Several torch optimizers for one model part: a list, as torch's get/set_optimizer_
    state_dict take for one model (states keyed by parameter name); `step` steps them all,
    `state` is theirs merged."""

    @property
    def state(self) -> dict:
        return {p: s for o in self for p, s in o.state.items()}

    def step(self) -> None:
        for o in self:
            o.step()
