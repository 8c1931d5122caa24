"""The launcher's torchrun stops the survivors of a failed worker with SIGKILL, never SIGTERM
(which the ranks would take for a preemption): both places torch 2.13 sends it from, the
process context's close() without a signal (its poll, on the first failed worker) and the
agent's _shutdown, while a signal torchrun handles (INT, HUP, QUIT) keeps its own."""

import signal
from types import SimpleNamespace

from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import PContext

from torchtitan.launcher import _kill_on_failure


def _context(sent: list):
    """What PContext.close touches: _close (records the signal), no tail logs, no files."""
    return SimpleNamespace(
        _close=lambda death_sig, timeout: sent.append(death_sig),
        _tail_logs=[],
        filtered_stdout=None,
        filtered_stderr=None,
    )


def test_survivors_of_a_failed_worker_get_sigkill(monkeypatch):
    # restored after the test: _kill_on_failure patches torch's classes for the process
    monkeypatch.setattr(PContext, "close", PContext.close)
    monkeypatch.setattr(LocalElasticAgent, "_shutdown", LocalElasticAgent._shutdown)
    sent: list = []
    PContext.close(_context(sent))
    assert sent == [signal.SIGTERM]  # torch's default: what the ranks would see
    _kill_on_failure()
    PContext.close(_context(sent))  # the poll's close() on the first failed worker
    PContext.close(_context(sent), signal.SIGINT)  # a signal torchrun handles keeps its own
    context = _context(sent)
    pcontext = SimpleNamespace(close=lambda sig, timeout: PContext.close(context, sig, timeout))
    agent = SimpleNamespace(_worker_watchdog=None, _health_check_server=None, _pcontext=pcontext)
    LocalElasticAgent._shutdown(agent)  # the agent's stop, default SIGTERM
    LocalElasticAgent._shutdown(agent, signal.SIGHUP)
    assert sent == [signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGKILL, signal.SIGHUP]
