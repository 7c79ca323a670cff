"""Training stages: LoRA SFT (``sft``), Best-of-N RL (``rl``) with its curriculum, and what they
share (batching, the optimisation loop, checkpoint state, metrics, data parallelism)."""
