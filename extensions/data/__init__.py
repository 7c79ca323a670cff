"""Data preparation: KernelBook pairs and KernelBench tasks -> the run's ``data/processed`` files.

    from extensions.data import prepare
    outcome = prepare(cfg, RunPaths.from_config(cfg).processed)

Modules: ``sources`` (hub, local files, bundled set), ``kernelbook`` (schema and normalisation to
KernelBench form), ``kernelbench`` (evaluation tasks), ``dedup`` (normalised-code similarity),
``operator_graph`` (what a program computes: traced ATen graphs, for decontamination),
``difficulty`` (AST difficulty labels), ``splits``, ``report``, ``pipeline`` (the stage itself),
``bundled`` (the starter set).
"""
from .pipeline import PrepareOutcome, format_summary, prepare
from .sources import SourceError

__all__ = ["PrepareOutcome", "SourceError", "format_summary", "prepare"]
