"""The AST difficulty labeller, measured on KernelBench whose levels are known."""
from __future__ import annotations

import json

import pytest

from extensions.data.difficulty import analyse_module, label_difficulty
from extensions.data.report import difficulty_agreement

SINGLE_OP = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)
def get_inputs(): return [torch.randn(4, 4)]
def get_init_inputs(): return []
"""

CHAIN = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.linear = nn.Linear(i, o)
    def forward(self, x):
        x = self.linear(x)
        x = torch.relu(x) * 2.0
        return x.sum(dim=1)
"""

ARCHITECTURE = """
import torch
import torch.nn as nn
class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3)
    def forward(self, x):
        return torch.relu(self.conv(x))
class Model(nn.Module):
    def __init__(self, c, depth):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(c) for _ in range(depth)])
    def forward(self, x):
        return self.blocks(x)
"""


def test_labels_follow_structure():
    assert label_difficulty(SINGLE_OP) == 1
    assert label_difficulty(CHAIN) == 2
    analysis = analyse_module(ARCHITECTURE)
    assert analysis.level == 3
    assert any("Block" in s for s in analysis.architecture_signals)
    assert any("Sequential" in s for s in analysis.architecture_signals)


def test_main_op_alone_is_level_one_and_named_class_is_found():
    source = CHAIN.replace("class Model", "class Dense").replace(
        "x = torch.relu(x) * 2.0\n        return x.sum(dim=1)", "return x")
    assert label_difficulty(source, "Dense") == 1


def test_no_module_class_is_an_error():
    with pytest.raises(ValueError, match="no nn.Module class"):
        analyse_module("x = 1\n")


def test_agreement_with_kernelbench_levels(kernelbench_jsonl):
    rows = [json.loads(line) for line in kernelbench_jsonl.read_text().splitlines() if line.strip()]
    pairs = [(row["level"], label_difficulty(row["code"])) for row in rows if row["level"] in (1, 2, 3)]
    agreement = difficulty_agreement(pairs)
    assert agreement["n"] == 250
    assert agreement["agreement"] >= 0.9, agreement
    for level, stats in agreement["per_level"].items():
        assert stats["agreement"] >= 0.85, (level, stats)
    assert sum(sum(row.values()) for row in agreement["confusion"].values()) == 250
