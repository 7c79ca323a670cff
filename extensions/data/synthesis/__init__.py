"""A KernelBook of our own: PyTorch programs compiled by torch inductor on a GPU, canonicalised and
verified (``python -m extensions.data.synthesis``; see docs/data.md, "Synthesized pairs")."""
