"""Extraction of the candidate module from raw model responses (table-driven)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

import pytest

from extensions.verify.static.extract import METHODS, extract_code, normalize_code

KERNEL = '''\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)
'''

MODELNEW = '''\
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y
'''

SOLUTION = KERNEL + "\n\n" + MODELNEW
HARNESS = '''\
if __name__ == "__main__":
    model = ModelNew().cuda()
    x = torch.randn(1024, device="cuda")
    print(torch.allclose(model(x), torch.relu(x)))
'''
ORIGINAL = '''\
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
'''


def fence(code: str, tag: str = "python", marker: str = "```") -> str:
    return f"{marker}{tag}\n{code.rstrip()}\n{marker}"


@dataclass
class Case:
    name: str
    response: str
    code: Optional[str]  # expected code (compared after normalize_code); None: an error
    method: str
    error: Optional[str] = None  # substring of the error when code is None
    contains: tuple[str, ...] = ()  # must appear in the extracted code
    absent: tuple[str, ...] = ()  # must not appear in the extracted code


DRAFT = MODELNEW.replace("relu_kernel[", "draft_kernel[")
TRUNCATED = SOLUTION + '''

def get_inputs():
    return [torch.randn(16, 16384, device="cuda"'''
TRUNCATED_IN_FORWARD = KERNEL + '''

class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BL'''

CASES = [
    Case("qwen prose + python fence",
         "Here is an optimized implementation using a custom Triton kernel:\n\n"
         + fence(SOLUTION) + "\n\nThe kernel processes 1024 elements per program and masks the tail.",
         SOLUTION, "fenced"),
    Case("py tag", "Sure!\n" + fence(SOLUTION, "py") + "\n", SOLUTION, "fenced"),
    Case("Python3 tag with title", fence(SOLUTION, "Python3 title=solution.py"), SOLUTION, "fenced"),
    Case("triton tag", "Optimized:\n" + fence(SOLUTION, "triton"), SOLUTION, "fenced"),
    Case("untagged fence", "```\n" + SOLUTION + "```\nDone.", SOLUTION, "fenced_untagged"),
    Case("tilde fence", fence(SOLUTION, "python", "~~~"), SOLUTION, "fenced"),
    Case("four-backtick fence", fence(SOLUTION, "python", "````"), SOLUTION, "fenced"),
    Case("deepseek think with draft inside",
         "<think>\nThe user wants ReLU. Maybe:\n```python\nclass ModelNew(nn.Module):\n"
         "    def forward(self, x):\n        return torch.relu(x)\n```\nNo, that uses torch. Use a "
         "kernel.\n</think>\n\nFinal answer:\n" + fence(SOLUTION),
         SOLUTION, "fenced", absent=("torch.relu",)),
    Case("closing think only (opening tag in template)",
         "Let me reason about the grid size...\nclass ModelNew draft here\n</think>\n" + fence(SOLUTION),
         SOLUTION, "fenced"),
    Case("ends inside reasoning", "<think>\nI should write a kernel\n```python\n" + SOLUTION,
         None, "none", error="inside reasoning"),
    Case("solution then test-harness block",
         "Solution:\n" + fence(SOLUTION) + "\n\nTest it with:\n" + fence(HARNESS)
         + "\n\nRun it on a GPU:\n" + fence("python test.py", "bash"),
         SOLUTION, "fenced", absent=("__main__",)),
    Case("original echoed, then the answer",
         "The original module:\n" + fence(ORIGINAL) + "\nThe Triton version:\n" + fence(SOLUTION),
         SOLUTION, "fenced", absent=("class Model(",)),
    Case("original repeated inside the answer block, never used",
         "Full module:\n" + fence(ORIGINAL + "\n\n" + SOLUTION.replace("import torch\nimport torch.nn as nn\n", "")),
         SOLUTION, "fenced", absent=("class Model(",)),
    Case("draft then final: the last complete block wins",
         "First attempt:\n" + fence(KERNEL + "\n\n" + DRAFT) + "\nImproved version:\n" + fence(SOLUTION),
         SOLUTION, "fenced"),
    Case("kernel and ModelNew in separate blocks",
         "Step 1, the kernel:\n" + fence(KERNEL) + "\n\nStep 2, the module:\n" + fence(MODELNEW),
         SOLUTION, "fenced"),
    Case("imports borrowed from the echoed original",
         "Given:\n" + fence(ORIGINAL) + "\nKernel and module:\n"
         + fence(SOLUTION.replace("import torch\nimport torch.nn as nn\n", "")),
         SOLUTION, "fenced", absent=("class Model(",)),
    Case("truncated after ModelNew (unterminated fence)",
         "Here you go:\n```python\n" + TRUNCATED, SOLUTION, "unterminated_fence",
         absent=("get_inputs",)),
    Case("truncated inside forward keeps what parses",
         "```python\n" + TRUNCATED_IN_FORWARD, None, "unterminated_fence",
         contains=("class ModelNew", "y = torch.empty_like(x)"), absent=("relu_kernel[",)),
    Case("truncated before ModelNew", "```python\n" + KERNEL + "\nclass Mod", None, "none",
         error="ModelNew"),
    Case("plain code, no fences", SOLUTION, SOLUTION, "unfenced"),
    Case("unfenced with prose around",
         "Here is the code:\n\n" + SOLUTION + "\nThis implementation fuses the ReLU.\n", SOLUTION,
         "unfenced"),
    Case("unfenced with a stray language word", "python\n" + SOLUTION, SOLUTION, "unfenced"),
    Case("windows line endings and BOM", "\ufeffHere:\r\n" + fence(SOLUTION).replace("\n", "\r\n"),
         SOLUTION, "fenced"),
    Case("tab-indented code", fence(SOLUTION.replace("    ", "\t")), SOLUTION, "fenced"),
    Case("mixed tabs and spaces", fence(SOLUTION.replace("        return y", "\treturn y")),
         SOLUTION, "fenced"),
    Case("fence inside a list item (indented)",
         "1. Write the kernel:\n\n   ```python\n" + "\n".join("   " + l for l in SOLUTION.splitlines())
         + "\n   ```\n", SOLUTION, "fenced"),
    Case("closing fence glued to last line", "```python\n" + SOLUTION.rstrip() + "```\nThanks",
         SOLUTION, "fenced"),
    Case("empty response", "", None, "none", error="empty response"),
    Case("whitespace response", "  \n\t\n", None, "none", error="empty response"),
    Case("prose only", "I am sorry, I cannot help with that.", None, "none", error="ModelNew"),
    Case("blocks without ModelNew", "Use:\n" + fence(KERNEL) + "\n" + fence("pip install triton", "bash"),
         None, "none", error="no code block defines ModelNew"),
    Case("ModelNew block with a syntax error is returned as written",
         fence(SOLUTION.replace("def forward(self, x):", "def forward(self, x)")), None, "fenced",
         contains=("def forward(self, x)\n",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_extract_table(case: Case):
    result = extract_code(case.response)
    assert result.method == case.method, (result.method, result.error, result.notes)
    assert result.method in METHODS
    if case.error is not None:
        assert result.code is None
        assert case.error in (result.error or ""), result.error
        return
    assert result.code is not None, result.error
    assert result.error is None
    if case.code is not None:
        assert normalize_code(result.code) == normalize_code(case.code), result.code
        ast.parse(result.code)
    for text in case.contains:
        assert text in result.code
    for text in case.absent:
        assert text not in result.code


def test_table_is_large_enough():
    assert len(CASES) >= 15


def test_candidates_seen_counts_blocks():
    response = "a\n" + fence(ORIGINAL) + "\nb\n" + fence(SOLUTION) + "\n" + fence("ls", "bash")
    assert extract_code(response).candidates_seen == 3
    assert extract_code("").candidates_seen == 0


def test_split_blocks_are_joined_in_order():
    result = extract_code(fence(KERNEL) + "\ntext\n" + fence(MODELNEW))
    assert result.code.index("def relu_kernel") < result.code.index("class ModelNew")
    assert any("joined" in note for note in result.notes)


def test_reasoning_code_never_wins_when_answer_has_none():
    response = "<think>\n" + fence(SOLUTION) + "\n</think>\nI could not finish."
    result = extract_code(response)
    assert result.code is None and result.method == "none"


def test_extraction_does_not_execute(tmp_path):
    marker = tmp_path / "ran"
    payload = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n" + SOLUTION
    extract_code(fence(payload))
    assert not marker.exists()


def test_normalize_code_ignores_comments_docstrings_and_layout():
    a = 'def f(x):\n    """Doc."""\n    # comment\n    return x+1\n'
    b = "def f(x):\n\n    return (x + 1)  # other\n"
    assert normalize_code(a) == normalize_code(b)
    assert normalize_code(a) != normalize_code(a.replace("x+1", "x+2"))


def test_normalize_code_falls_back_for_unparseable_text():
    a = "def f(x)\r\n\treturn   x\n\n"
    b = "def f(x)\n    return x"
    assert normalize_code(a) == normalize_code(b)


def test_non_text_response_is_an_error():
    result = extract_code(None)  # type: ignore[arg-type]
    assert result.code is None and "not text" in result.error


def test_a_used_reference_class_is_kept_for_the_static_check():
    """Only an unreferenced echo is dropped: subclassing Model must still reach the static check."""
    from extensions.verify.static.static_check import static_check

    inherited = ORIGINAL + "\n\n" + MODELNEW.replace("class ModelNew(nn.Module)", "class ModelNew(Model)")
    result = extract_code(fence(KERNEL + "\n" + inherited.replace("import torch\nimport torch.nn as nn\n", "")))
    assert "class Model(" in result.code
    assert "reference_model" in static_check(result.code).flags
