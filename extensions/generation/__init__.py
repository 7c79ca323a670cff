"""Generation from a model: decoding settings and batched sampling, and multi-turn conversations
that feed the verifier's verdict back to the model."""
