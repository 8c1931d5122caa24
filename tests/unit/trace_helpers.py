"""Running a function under the memory tracker with the step-time trace attached (the
simulation's own pairing, planning/simulate), for the step-time unit tests."""

from torchtitan.planning.simulate.tracker import LiveBytes
from torchtitan.planning.step_time.trace import OpTrace, Segment


def trace_segments(fn, profile, compiled: bool = False) -> list[Segment]:
    """Run fn under the memory tracker with an OpTrace attached (phase "forward")."""
    trace = OpTrace(profile, compiled)
    tracker = LiveBytes(lambda *a: "activations")
    tracker.observer = trace
    tracker.phase = "forward"
    with tracker, trace.recording():
        fn()
    return trace.segments
