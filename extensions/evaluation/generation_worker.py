"""One GPU's share of an evaluation's generation.

``runner.generate_responses`` starts one of these per visible GPU (pinned with
CUDA_VISIBLE_DEVICES) when there are several and the model is not sharded over all of them with
``model.device_map``. Each loads its own copy of the model, generates whole chunks of tasks (with
the seeds a single process would use) and appends every finished chunk to the shared generations
file under a lock, so a crash keeps what was done.

    python -m extensions.evaluation.generation_worker SPEC.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from ..config import ModelConfig, build
    from .records import EvalTask
    from .runner import EvalSettings, generate_chunks

    spec = json.loads(Path(argv[0]).read_text())
    chunks = [[EvalTask(**task) for task in chunk] for chunk in spec["chunks"]]
    generate_chunks(Path(spec["generations"]), spec["model_path"], chunks, EvalSettings(**spec["settings"]),
                    build(ModelConfig, spec["model_cfg"]), progress=spec["progress"], position=spec["worker"],
                    messages=spec.get("messages"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
