"""The builder that assembles a task's prompt under ``prompt.mode``: plain, or with retrieved worked
examples (RA-ICL), from the templates in ``extensions.prompting.templates``.

SFT data, RL rollouts and evaluation all ask through a ``PromptBuilder``, so train and test see the
same format. In ``raicl`` mode the ``raicl_k`` KernelBook pairs most similar to the task are shown
before it, best first, as long as they fit ``raicl_max_example_chars`` (one that does not fit gives
its place to the next most similar of the 4k nearest); the task itself is never among them (see
``extensions.data.retrieval``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .templates import EXAMPLES_AS, add_worked_examples, build_messages, prompt_text_digest

PROMPT_MODES = ("plain", "raicl")
_CANDIDATES_PER_EXAMPLE = 4


@dataclass
class PromptBuilder:
    mode: str = "plain"
    k: int = 3
    max_example_chars: int = 12000
    retriever: Optional[Any] = None  # an extensions.data.retrieval.ExampleRetriever in raicl mode
    examples_over_budget: int = 0  # retrieved examples left out because they did not fit
    prompts_built: int = 0
    examples_shown: int = 0
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in PROMPT_MODES:
            raise ValueError(f"prompt.mode must be one of {PROMPT_MODES}, got {self.mode!r}")
        if self.mode == "raicl":
            if self.k < 1:
                raise ValueError(f"prompt.raicl_k must be >= 1 in raicl mode, got {self.k}")
            if self.max_example_chars < 1:
                raise ValueError(f"prompt.raicl_max_example_chars must be >= 1, got {self.max_example_chars}")
            if self.retriever is None:
                raise ValueError("prompt.mode raicl needs a retrieval index (run prepare_data.py)")

    @classmethod
    def from_config(cls, prompt_cfg, open_retriever: Callable[[], Any]) -> "PromptBuilder":
        """The builder ``prompt_cfg`` asks for; ``open_retriever`` is called in raicl mode only (plain
        prompts need no index)."""
        retriever = open_retriever() if prompt_cfg.mode == "raicl" else None
        return cls(prompt_cfg.mode, prompt_cfg.raicl_k, prompt_cfg.raicl_max_example_chars, retriever)

    def examples_for(self, task_code: str, task_id: Optional[str] = None) -> list[tuple[str, str]]:
        """The (task, solution) pairs shown before ``task_code`` (none in plain mode)."""
        if self.mode == "plain":
            return []
        key = (task_id, task_code)
        if key in self._cache:
            return self._cache[key]
        # A few more candidates than k, so that an example too long for the budget gives its place
        # to the next most similar one instead of leaving the prompt without examples.
        hits = self.retriever.search(task_code, _CANDIDATES_PER_EXAMPLE * self.k,
                                     exclude_ids=[task_id] if task_id else [])
        chosen, used = [], 0
        for example, _score in hits:
            if len(chosen) == self.k:
                break
            size = len(example.task_code) + len(example.solution_code)
            if used + size > self.max_example_chars:
                self.examples_over_budget += 1
                continue
            chosen.append((example.task_code, example.solution_code))
            used += size
        self._cache[key] = chosen
        return chosen

    def messages(self, task_code: str, task_id: Optional[str] = None) -> list[dict[str, str]]:
        """Chat messages asking for a Triton rewrite of ``task_code`` (``task_id``: its own id, so a
        KernelBook task never sees its own solution)."""
        examples = self.examples_for(task_code, task_id)
        self.prompts_built += 1
        self.examples_shown += len(examples)
        return add_worked_examples(build_messages(task_code), examples)

    def describe(self) -> dict:
        """What decides the prompts' text: saved with generations so a change is noticed."""
        if self.mode == "plain":
            return {"mode": "plain", "text": prompt_text_digest()}
        return {"mode": "raicl", "text": prompt_text_digest(), "k": self.k, "max_example_chars": self.max_example_chars,
                "examples_as": EXAMPLES_AS,
                "index": {k: self.retriever.meta.get(k) for k in ("backend", "examples", "model")}}

    def stats(self) -> dict:
        """Retrieval hit statistics for reports and metrics."""
        out = {"mode": self.mode, "prompts": self.prompts_built, "examples_shown": self.examples_shown,
               "examples_over_budget": self.examples_over_budget}
        if self.retriever is not None:
            out["retrieval"] = self.retriever.stats.to_dict()
        return out
