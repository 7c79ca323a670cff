"""The worked-example index prepare_data.py builds, and the RA-ICL prompts it feeds: what is indexed,
that no task sees itself or an evaluation task, the prompt budget, and the dense backend's errors."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from extensions.config import load_config
from extensions.data import prepare
from extensions.data.bundled import bundled_eval_tasks, bundled_pairs
from extensions.data.dedup import code_shingles, jaccard
from extensions.data.kernelbook import rename_class
from extensions.runtime.paths import RunPaths, retrieval_index_dir
from extensions.prompting.builder import PromptBuilder
from extensions.prompting.templates import CLOSING_LINE, build_messages, format_completion
from extensions.data.retrieval import Example, ExampleRetriever, RetrievalUnavailable, build_index
from project_paths import PROJECT_ROOT

SMOKE = PROJECT_ROOT / "configs" / "smoke.yaml"


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _copy_of_eval_task(name: str) -> dict:
    """A KernelBook row whose task is a bundled evaluation task under another class name."""
    task = next(t for t in bundled_eval_tasks() if t.name == name)
    code = rename_class(task.code, "Model", "CopiedTask").replace("class CopiedTask", "# copied\nclass CopiedTask")
    solution = next(r for r in bundled_pairs() if r["module_name"] == "relu")["triton_code"]
    return {"uuid": f"copy-{name}", "entry_point": "CopiedTask", "python_code": code,
            "triton_code": solution.replace("class ReluActivationNew", "class CopiedTaskNew"),
            "repo_name": "somewhere"}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The bundled KernelBook set plus two copies of evaluation tasks, prepared in raicl mode."""
    root = tmp_path_factory.mktemp("retrieval")
    source = root / "kernelbook.jsonl"
    rows = list(bundled_pairs()) + [_copy_of_eval_task("row_logsumexp"), _copy_of_eval_task("mish")]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = load_config(SMOKE, [f"data.kernelbook={source}", "prompt.mode=raicl", "prompt.raicl_k=3",
                              f"run.root={root}"])
    out = RunPaths.from_config(cfg).processed
    outcome = prepare(cfg, out, progress=False)
    return cfg, out, outcome.report


def test_index_holds_the_sft_training_pairs_and_reports_its_size(prepared):
    cfg, out, report = prepared
    index_dir = RunPaths.from_config(cfg).retrieval_index
    assert index_dir == retrieval_index_dir(out) and (index_dir / "meta.json").is_file()
    train = _read_jsonl(out / "sft_train.jsonl")
    meta = report["retrieval"]["index"]
    assert meta["backend"] == "lexical" and meta["examples"] == len(train) > 0
    assert meta["bytes"] > 0 and meta["vocabulary"] > 10
    indexed = {row["example_id"] for row in _read_jsonl(index_dir / "examples.jsonl")}
    assert indexed == {f"kb_{row['uuid']}" for row in train}
    assert report["sources"]["kernelbook"]["dropped"].get("overlaps_eval_problem") == 2


def test_no_task_retrieves_itself_or_an_evaluation_task(prepared):
    cfg, out, _report = prepared
    builder = PromptBuilder.from_config(cfg.prompt, lambda: ExampleRetriever.open(retrieval_index_dir(out)))
    eval_tasks = _read_jsonl(out / "eval_tasks.jsonl")
    eval_shingles = [code_shingles(t["code"]) for t in eval_tasks]
    code_of = {e.example_id: e.task_code for e in builder.retriever.examples}

    shown = 0
    for task in eval_tasks:
        for example_task, _solution in builder.examples_for(task["code"], task["task_id"]):
            shown += 1
            assert "CopiedTask" not in example_task  # the planted copies never made it into the index
            assert max(jaccard(code_shingles(example_task), s) for s in eval_shingles) < \
                cfg.data.decontamination_threshold
    assert shown > 0  # evaluation prompts do get examples

    for row in _read_jsonl(out / "rl_tasks.jsonl"):
        hits = builder.retriever.search(row["code"], 3, exclude_ids=[row["task_id"]])
        assert all(example.example_id != row["task_id"] for example, _ in hits)
    for example_id, task_code in code_of.items():
        # Excluded by id, and by its code when the caller does not know the id.
        for exclude in ([example_id], []):
            hits = builder.retriever.search(task_code, 3, exclude_ids=exclude)
            assert hits and all(found.task_code != task_code for found, _ in hits)
    assert builder.retriever.stats.self_matches_excluded >= 2 * len(code_of)


def test_sft_prompts_show_other_pairs_never_their_own_solution(prepared):
    _cfg, out, report = prepared
    rows = _read_jsonl(out / "sft_train.jsonl") + _read_jsonl(out / "sft_val.jsonl")
    with_examples = 0
    for row in rows:
        prompt = "\n".join(turn["content"] for turn in row["prompt"])
        own_solution = row["completion"].removeprefix("```python\n").removesuffix("\n```")
        assert own_solution not in prompt
        # The fixed worked example's exchange, then at least one retrieved pair's.
        with_examples += len(row["prompt"]) >= len(build_messages("x")) + 2
    assert with_examples == len(rows)
    stats = report["retrieval"]["sft_prompts"]
    assert stats["mode"] == "raicl" and stats["prompts"] == len(rows)
    assert stats["retrieval"]["hit_rate"] == 1.0


def test_example_budget_leaves_out_what_does_not_fit(tmp_path):
    task = "import torch\nclass Model:\n    def forward(self, x):\n        return torch.relu(x) + {}\n"
    examples = [Example(f"kb_{i}", task.format(i), "s" * size) for i, size in enumerate((50, 5000, 60))]
    build_index(examples, tmp_path / "retrieval")
    retriever = ExampleRetriever.open(tmp_path / "retrieval")
    builder = PromptBuilder("raicl", k=3, max_example_chars=400, retriever=retriever)
    query = "import torch\nclass Model:\n    def forward(self, x):\n        return torch.relu(x) * 1\n"
    assert retriever.search(query, 1)[0][0].example_id == "kb_1"  # the long one is the most similar
    shown = builder.examples_for(query)
    assert len(shown) == 2 and all(len(task) + len(solution) <= 400 for task, solution in shown)
    assert builder.examples_over_budget == 1
    # With k=1 the long example does not keep the prompt empty: the next most similar one fits.
    one = PromptBuilder("raicl", k=1, max_example_chars=400, retriever=retriever)
    assert len(one.examples_for(query)) == 1
    messages = builder.messages(query)
    plain = PromptBuilder("plain").messages(query)
    # Each example is an earlier exchange (its task, then its rewrite), the most similar one last,
    # right before the task; the task's own turn is the plain prompt's plus one closing line.
    examples = messages[len(plain) - 1:-1]
    assert [m["role"] for m in examples] == ["user", "assistant"] * 2
    assert [m["content"] for m in examples[1::2]] == [format_completion(s) for _t, s in reversed(shown)]
    assert shown[0][0].strip() in examples[-2]["content"]
    assert messages[:len(plain) - 1] == plain[:-1]
    assert messages[-1]["content"] == f"{plain[-1]['content']}\n\n{CLOSING_LINE}"


def test_bad_prompt_settings_and_missing_index_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="prompt.mode"):
        PromptBuilder("fancy")
    with pytest.raises(ValueError, match="raicl_k"):
        PromptBuilder("raicl", k=0, retriever=object())
    cfg = load_config(SMOKE, ["prompt.mode=raicl"])
    with pytest.raises(RetrievalUnavailable, match="run prepare_data.py"):
        PromptBuilder.from_config(cfg.prompt, lambda: ExampleRetriever.open(tmp_path / "nowhere"))


def test_dense_backend_without_its_packages_errors_clearly(tmp_path):
    if importlib.util.find_spec("faiss") and importlib.util.find_spec("sentence_transformers"):
        pytest.skip("sentence-transformers and faiss are installed here")
    with pytest.raises(RetrievalUnavailable, match="sentence-transformers and faiss"):
        build_index([Example("kb_1", "x = 1\n", "y = 2\n")], tmp_path / "retrieval", "dense", "some/model")
    assert list(tmp_path.iterdir()) == []  # nothing half-built is left behind


def test_lexical_search_reads_operators_and_name_parts(tmp_path):
    """``x + y`` finds ``x * y + z`` and ``leaky_relu`` finds ``relu``, among pairs that share every
    other term; without the operators and name parts they would tie."""
    from extensions.data.kernelbook import normalise_row

    pairs = {row["uuid"]: normalise_row(row) for row in bundled_pairs()}
    indexed = ["mul_add", "relu", "tanh", "linear", "scaled_matmul", "softplus", "gelu", "hardswish"]
    build_index((Example(name, pairs[f"bundled-{name}"].task_code, pairs[f"bundled-{name}"].solution_code)
                 for name in indexed), tmp_path / "index")
    retriever = ExampleRetriever.open(tmp_path / "index")
    for query, expected in (("add", "mul_add"), ("leaky_relu", "relu")):
        best, _score = retriever.search(pairs[f"bundled-{query}"].task_code, 1)[0]
        assert best.example_id == expected, query
