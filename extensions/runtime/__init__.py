"""Run infrastructure shared by every stage script: where a run's files live, complete checkpoints,
the run lock, save requests on interruption, whether a finished stage still fits the config, how a
stage script starts and fails, and the small file helpers (atomic writes, hashes, JSONL) they share."""
