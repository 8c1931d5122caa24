"""Memory: each rank role's predicted peak, the per-rank budget, the torch-free model-states
floor the config check uses, and the largest local batch / sequence that fits."""
