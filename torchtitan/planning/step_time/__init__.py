"""Step time: the trace of a simulated step (ops, FLOPs, bytes, collectives), the model that
turns it into time on a hardware profile (torchtitan/hardware.py), the timing of one simulated
rank and of every rank role, and this machine's measured `local` profile."""
