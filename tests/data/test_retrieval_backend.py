"""The lexical retrieval path never imports JAX: bm25s would pick it (and JAX would take 75% of the
GPU's memory, which a later SFT run on that GPU needs) wherever it can be imported."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("bm25s")

from extensions.data.retrieval import Example, ExampleRetriever, build_index  # noqa: E402
from project_paths import PROJECT_ROOT


EXAMPLES = [
    Example("relu", "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                    "    def forward(self, x):\n        return torch.relu(x)\n", "relu solution"),
    Example("softmax", "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                       "    def forward(self, x):\n        return torch.softmax(x, dim=1)\n", "softmax solution"),
]
QUERY = ("import torch\nimport torch.nn as nn\n\nclass Other(nn.Module):\n"
         "    def forward(self, y):\n        return torch.relu(y) * 2\n")

# A jax that records who imported it, then looks missing. find_spec finds it without running it, so
# only a real import leaves a mark.
FAKE_JAX = """\
import os
import traceback

with open(os.environ["FAKE_JAX_MARKER"], "a") as handle:
    handle.write("".join(traceback.format_stack()) + "\\n")
raise ImportError("fake jax: the retrieval path must not import jax")
"""

SCRIPT = """\
import json
import os
import sys
from pathlib import Path

from extensions.data.retrieval import Example, ExampleRetriever, build_index

examples = [Example(*row) for row in json.loads(sys.argv[1])]
build_index(examples, Path(sys.argv[2]))
hits = ExampleRetriever.open(Path(sys.argv[2])).search(sys.argv[3], k=2)
marker = Path(os.environ["FAKE_JAX_MARKER"])
print(json.dumps({"hits": [example.example_id for example, _ in hits],
                  "jax_imported": marker.is_file(), "stack": marker.read_text() if marker.is_file() else "",
                  "jax_in_modules": sys.modules.get("jax") is not None}))
# Control: the fake jax is the one this process would import.
try:
    import jax  # noqa: F401
except ImportError:
    pass
print(json.dumps({"control_marked": marker.is_file()}))
"""


def test_building_and_querying_the_index_never_imports_jax(tmp_path):
    fake = tmp_path / "fake"
    (fake / "jax").mkdir(parents=True)
    (fake / "jax" / "__init__.py").write_text(FAKE_JAX)
    marker = tmp_path / "jax-imported.txt"
    env = dict(os.environ, FAKE_JAX_MARKER=str(marker),
               PYTHONPATH=os.pathsep.join(filter(None, [str(fake), str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))
    rows = json.dumps([[e.example_id, e.task_code, e.solution_code] for e in EXAMPLES])
    done = subprocess.run([sys.executable, "-c", SCRIPT, rows, str(tmp_path / "index"), QUERY], cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result, control = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert control["control_marked"], "the fake jax was not importable: the test would prove nothing"
    assert not result["jax_imported"], "the retrieval path imported jax:\n" + result["stack"]
    assert not result["jax_in_modules"]
    assert result["hits"] and result["hits"][0] == "relu"


def test_indexing_and_top_k_name_the_numpy_backend(tmp_path, monkeypatch):
    build_index(EXAMPLES, tmp_path / "index")
    retriever = ExampleRetriever.open(tmp_path / "index")
    assert retriever.backend.model.backend == "numpy"
    # As if JAX had been importable: bm25s's "auto" top-k would then pick it.
    selection = importlib.import_module("bm25s.selection")

    def no_jax(*args, **kwargs):
        raise AssertionError("bm25s chose its JAX top-k")

    monkeypatch.setattr(selection, "JAX_IS_AVAILABLE", True)
    monkeypatch.setattr(selection, "_topk_jax", no_jax)
    hits = retriever.search(QUERY, k=2)
    assert hits and hits[0][0].example_id == "relu"
