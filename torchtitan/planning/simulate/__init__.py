"""One simulated training step of one pipeline rank (fake tensors, the trainer's own build and
step code), the pool that runs a prediction's simulations side by side, and which rank roles
are simulated and which derived from them. Knows nothing of step time: a caller that times
the step hands in an op observer (planning/step_time/rank.py)."""
