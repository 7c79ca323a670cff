"""Evaluation: generate Triton rewrites of KernelBench tasks with a model, verify them, and report.

    records.py   per-task, per-sample verdicts (what every metric is computed from)
    stats.py     pass@k (unbiased estimator), geometric mean, paired bootstrap intervals
    metrics.py   KernelBench metrics from records; ``recompute_metrics(report)``
    inputs.py    tasks and generations JSONL readers that report every bad row
    runner.py    generate (saved before verification) and verify one model
    compare.py   paired comparison of several models' reports: JSON, markdown, PNG
    commands.py  the three ``evaluate.py`` modes and their exit statuses

Nothing here imports torch, transformers or matplotlib at module import time.
"""
