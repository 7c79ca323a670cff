"""Where a worker's files are inside the bubblewrap sandbox, and the variables that point a
candidate's process into its own directory.

Both sides need these: the parent builds the sandbox's command line and environment from them, and
the fork server inside it sets them again in each child it forks.
"""
from __future__ import annotations

import os

INSIDE_WORK_DIR = "/sandbox/work"
INSIDE_CODE_DIR = "/sandbox/code"


def per_candidate_env(home: str) -> dict[str, str]:
    """Variables that point into the candidate's own directory (set again in each forked child)."""
    return {
        "HOME": home, "TMPDIR": home,
        "TRITON_CACHE_DIR": os.path.join(home, ".triton", "cache"), "TRITON_HOME": home,
        "XDG_CACHE_HOME": os.path.join(home, ".cache"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(home, ".inductor"),
        "MPLCONFIGDIR": os.path.join(home, ".mpl"),
    }
