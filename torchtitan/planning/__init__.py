"""What is decided before launch, from one simulated step of the real build, per rank role.

Sub-layers, bottom first (each imports only those before it; tests/unit/test_import_layers.py):

- simulate/   one training step of one pipeline rank on fake tensors, its live bytes, and
              which roles are simulated or derived from simulated ones
- step_time/  what a simulated step computes and communicates (the trace), the step-time
              model that times it on a hardware profile, and this machine's measured profile
- memory/     peak per rank role, the memory budget, the model-states floor, the largest fit
- search/     the layout space, the block probe and the composed model, the layout search, the nearby choices
- startup.py  the trainer's start-up gate (predict in a child, refuse what will not fit)
"""
