"""The model card (README.md) of what leaves a run: a trained LoRA adapter, or a merged export.

PEFT's ``save_pretrained`` writes an empty card template whose ``base_model`` is the path the base
weights were loaded from. ``write_model_card`` replaces it with a card that names the base model by
its hub id (``base_model_for``: a ``fetch:`` model by the original it was quantized from, a local
directory by the hub id its files record; never by a path) and says what the model was trained on
and how it did: the data counts of the run's ``prepare_report.json``, the verifier's code digest,
the training stage with its steps or rounds (the checkpoint's ``meta.json``) and, when the run's
``outputs/compare.json`` evaluated this very adapter (matched by content), its results.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .. import models
from ..config.sections import HUB_REPO_ID
from ..models.loading import looks_like_local_path
from ..runtime.checkpoints import adapter_content_hash, finalize, is_complete, read_meta
from ..runtime.io import atomic_write_text
from ..runtime.paths import RunPaths

CARD = "README.md"
TAGS = ["lora", "triton", "kernel-generation", "gpu-kernels", "code"]
# A hub snapshot directory (``.../models--OWNER--NAME/snapshots/<sha>``) names its repository.
_HUB_CACHE_PART = re.compile(r"^models--([^/]+?)--([^/]+)$")
NO_RUN = ("The adapter does not lie in a run directory (`ROOT/checkpoints/<stage>/<name>`), so {what} not "
          "available.")
# compare.json fields shown in the card's table, in this order, when some model has them.
EVAL_COLUMNS = (("correct_rate", "correct %"), ("compiled_rate", "compiled %"), ("fast_1", "fast_1 %"),
                ("geomean_speedup", "geomean speedup"))


@dataclass(frozen=True)
class BaseModel:
    """The base model as a card names it."""

    name: str  # how the card's text names it
    hub_id: Optional[str]  # front matter's base_model; None when it is not a hub model
    origin: str  # where the run's weights came from: a sentence without its full stop
    license: Optional[str] = None


# -- the base model ------------------------------------------------------------------------------------
def _is_hub_id(name: str) -> bool:
    # Canonical models have no owner ("gpt2"); everything else is owner/name.
    return bool(HUB_REPO_ID.match(name)) or bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", name))


def _catalogue_license(hub_id: str) -> Optional[str]:
    return next((m.license for m in models.MODELS.values() if m.hub_id == hub_id), None)


def _front_matter(readme: Path) -> dict:
    """The YAML header of a model card, {} when there is none or it does not parse."""
    import yaml

    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not match:
        return {}
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _local_base(directory: Path, what: str) -> BaseModel:
    """A base model loaded from a directory: its hub id when its files record one, else its name."""
    for part in directory.parts:
        cached = _HUB_CACHE_PART.match(part)
        if cached:
            hub_id = f"{cached.group(1)}/{cached.group(2)}"
            return BaseModel(hub_id, hub_id, "The run loaded it from a local copy (the hub's download cache)",
                             _catalogue_license(hub_id))
    recorded = None
    try:
        recorded = json.loads((directory / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        pass
    card = _front_matter(directory / CARD)
    license_id = card.get("license") if isinstance(card.get("license"), str) else None
    if isinstance(recorded, str) and _is_hub_id(recorded) and not os.path.exists(recorded):
        return BaseModel(recorded, recorded, f"The run loaded it from {what} whose config records `{recorded}`",
                         license_id or _catalogue_license(recorded))
    name = directory.name or directory.resolve().name
    return BaseModel(name, None, f"The run loaded it from {what} (`{name}`); it is not a model on the hub",
                     license_id)


def base_model_for(name_or_path: str) -> BaseModel:
    """What a card names as the base of an adapter trained on ``model.name_or_path``."""
    if not name_or_path.strip():
        return BaseModel("an unrecorded base model", None, "The checkpoint's meta.json does not name it")
    if name_or_path.startswith(models.PREFIX):
        name = name_or_path[len(models.PREFIX):].strip()
        entry = models.MODELS.get(name)
        if entry is None or not entry.hub_id:
            return BaseModel(name_or_path, None, "A fetched model whose original on the hub is not known")
        return BaseModel(
            entry.hub_id, entry.hub_id,
            f"The run trained on `{name_or_path}` ({entry.description}), fetched and sha256-verified by "
            f"`python -m extensions.models fetch {name}` and dequantized on load: the adapter was fitted to "
            "those weights, which differ slightly from the original's", entry.license)
    if name_or_path.startswith("pkg:"):
        module = name_or_path[len("pkg:"):].strip()
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            return _local_base(Path(list(spec.submodule_search_locations)[0]), f"the Python package `{module}`")
        return BaseModel(module, None, f"The run loaded it from the Python package `{module}`; it is not a model "
                                       "on the hub")
    local = Path(os.path.expanduser(name_or_path))
    if local.exists() or looks_like_local_path(name_or_path):
        return _local_base(local, "a local directory")
    if _is_hub_id(name_or_path):
        return BaseModel(name_or_path, name_or_path, "The run loaded it from the hub", _catalogue_license(name_or_path))
    return BaseModel(local.name, None, f"The run loaded it from a local model (`{local.name}`)")


# -- the run's records --------------------------------------------------------------------------------
def _read_json(path: Path) -> tuple[Optional[Any], Optional[str]]:
    """(data, None), or (None, why not)."""
    if not path.is_file():
        return None, "not found"
    try:
        return json.loads(path.read_text()), None
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({type(exc).__name__})"


def _source_label(source: Any) -> str:
    """A data source as the card may show it: a hub id or "bundled", a file by its name only."""
    text = str(source)
    if not looks_like_local_path(text) and not os.path.exists(os.path.expanduser(text)):
        return text
    return f"local file {Path(text).name}"


def data_lines(report_path: Optional[Path]) -> list[str]:
    """The data section: pairs by source, the splits, how many pairs the verifier passed."""
    if report_path is None:
        return [NO_RUN.format(what="the data counts are")]
    report, why = _read_json(report_path)
    if not isinstance(report, dict):
        return [f"The run's `data/processed/prepare_report.json` was {why or 'not a JSON object'}, so the data "
                "counts are not available."]
    lines = ["KernelBook pairs (a PyTorch module and its Triton rewrite) and KernelBench-style evaluation "
             "tasks, as prepared for this run (`prepare_report.json`):", "",
             "| source | rows read | kept |", "|---|---:|---:|"]
    for name, tally in (report.get("sources") or {}).items():
        if isinstance(tally, dict):
            lines.append(f"| {name} ({_source_label(tally.get('source', name))}) | {tally.get('read', 'n/a')} | "
                         f"{tally.get('kept', 'n/a')} |")
    outputs = report.get("outputs") or {}
    splits = [(key, label) for key, label in (("sft_train", "SFT training pairs"), ("sft_val", "SFT validation pairs"),
                                              ("rl_tasks", "RL tasks"), ("eval_tasks", "evaluation tasks"))
              if key in outputs]
    if splits:
        lines += ["", "Splits: " + ", ".join(f"{outputs[key]} {label}" for key, label in splits) + "."]
    verification = report.get("verification") or {}
    if "passed" in verification:
        devices = ", ".join(verification.get("devices") or []) or "n/a"
        lines += ["", f"Verified: {verification['passed']} of {verification.get('pairs', 'n/a')} kept pairs passed "
                      f"the verifier ({devices}); the others were dropped before training."]
    elif verification.get("skipped"):
        lines += ["", f"The pairs were not verified: {verification['skipped']}."]
    return lines


def verifier_lines(report_path: Optional[Path]) -> list[str]:
    """The verifier's code digest now, and the one the data stage verified the pairs with."""
    from ..data.pair_verification import verifier_digest

    digest = verifier_digest()
    lines = ["Rewards and data checks come from the project's sandboxed verifier (compile, correctness on "
             f"several inputs, timing on a GPU). Verifier code digest when this card was written: `{digest[:16]}` "
             "(sha256 over the verifier's and the timer's source; the data stage keys its verdicts by it)."]
    report, _ = _read_json(report_path) if report_path is not None else (None, None)
    verified_with = ((report or {}).get("fingerprint") or {}).get("verifier") if isinstance(report, dict) else None
    if isinstance(verified_with, str) and verified_with != digest:
        lines.append(f"The training pairs were verified by another version of it (digest `{verified_with[:16]}`).")
    return lines


def training_lines(meta: dict, paths: Optional[RunPaths]) -> list[str]:
    """What the adapter went through: the stage, its steps or rounds, the LoRA shape."""
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    stage = meta.get("stage")
    lines = []
    if stage == "sft":
        data = meta.get("data") or {}
        pairs = f" on {data['train_examples']} pairs" if isinstance(data, dict) and "train_examples" in data else ""
        loss = meta.get("final_eval_loss")
        lines.append(f"- Stage: supervised fine-tuning (SFT), {meta.get('step')} optimizer steps{pairs}"
                     + (f"; final validation loss {loss:.4f}" if isinstance(loss, (int, float)) else "") + ".")
    elif stage == "rl":
        rl = config.get("rl") or {}
        start = "the base model with a fresh LoRA adapter" if rl.get("init") == "base" else "the SFT adapter"
        sft_step = None
        if rl.get("init") != "base" and paths is not None:
            sft_meta, _ = _read_json(paths.final("sft") / "meta.json")
            sft_step = sft_meta.get("step") if isinstance(sft_meta, dict) else None
        if sft_step is not None:
            start += f" ({sft_step} SFT steps)"
        lines.append(f"- Stage: reinforcement learning on verified rewards, {meta.get('round')} rounds of "
                     f"`{meta.get('algorithm', rl.get('algorithm'))}` (reward preset "
                     f"`{meta.get('reward_preset', rl.get('reward_preset'))}`), starting from {start}.")
        summary = meta.get("round_summary") or {}
        if summary.get("judged"):
            lines.append(f"- Last round: {summary.get('correct')} of {summary['judged']} sampled kernels correct.")
    else:
        lines.append(f"- Stage: {stage}.")
    lora = meta.get("lora") or {}
    if lora:
        lines.append(f"- LoRA: r={lora.get('r')}, alpha={lora.get('alpha')}, dropout={lora.get('dropout')}, on "
                     + ", ".join(f"`{m}`" for m in lora.get("target_modules") or []) + ".")
    if meta.get("stage_fingerprint"):
        lines.append(f"- Settings fingerprint (the keys that decide this stage): `{meta['stage_fingerprint']}`; "
                     "the full resolved config is the run checkpoint's `config.yaml`.")
    return lines


def _fmt(value: Any, suffix: str = "", digits: int = 1) -> str:
    return f"{value:.{digits}f}{suffix}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def evaluation_lines(compare_path: Optional[Path], adapter_hash: Optional[str]) -> list[str]:
    """The results of ``compare.json`` when it evaluated this adapter, else why there are none."""
    if compare_path is None:
        return [NO_RUN.format(what="evaluation results are")]
    comparison, why = _read_json(compare_path)
    if comparison is None and why == "not found":
        return ["No evaluation yet: `evaluate.py --compare` writes the run's `outputs/compare.json`; a merged "
                "export made afterwards (`python -m extensions.export`) carries its results."]
    if not isinstance(comparison, dict) or not isinstance(comparison.get("models"), dict):
        return [f"The run's `outputs/compare.json` was {why or 'not a comparison'}: no results shown."]
    models_in = comparison["models"]
    order = [n for n in comparison.get("model_order") or list(models_in) if isinstance(models_in.get(n), dict)]
    evaluated = ((comparison.get("inputs") or {}).get("models") or {})
    this = [name for name, identity in evaluated.items() if adapter_hash and identity == adapter_hash]
    caveat = []
    if evaluated and not this:
        return ["The run's `outputs/compare.json` evaluated other adapters than this one (made before it was "
                "trained): no results shown."]
    if not evaluated:
        caveat = ["", "(`compare.json` does not name its models by content, so these rows could not be matched "
                      "to this adapter.)"]
    columns = [(key, label) for key, label in EVAL_COLUMNS if any(key in models_in[n] for n in order)]
    tasks = comparison.get("paired_tasks")
    lines = ["From the run's `outputs/compare.json`: every model on the same held-out tasks"
             + (f" ({tasks} tasks evaluated by all)" if tasks is not None else "")
             + "; rates are percentages of all samples.", "",
             "| model | " + " | ".join(label for _, label in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for name in order:
        row = models_in[name]
        cells = [_fmt(row.get(key), "x", 2) if key == "geomean_speedup" else _fmt(row.get(key)) for key, _ in columns]
        lines.append(f"| {name}{' (this model)' if name in this else ''} | " + " | ".join(cells) + " |")
    reasons = sorted({row.get("no_timing_reason") for row in (models_in[n] for n in order)
                      if not row.get("timing") and row.get("no_timing_reason")})
    if reasons and any(key in ("fast_1", "geomean_speedup") for key, _ in columns):
        lines += ["", f"Speedups are n/a where nothing was timed: {'; '.join(reasons)}."]
    return lines + caveat


def usage_lines(base: BaseModel, repo_id: Optional[str], merged: bool) -> list[str]:
    here = repo_id or "path/to/this/folder"
    if merged:
        load = [f'model = AutoModelForCausalLM.from_pretrained("{here}", dtype="auto")',
                f'tokenizer = AutoTokenizer.from_pretrained("{here}")']
        imports = ["from transformers import AutoModelForCausalLM, AutoTokenizer"]
    else:
        base_ref = base.hub_id or f"path/to/{base.name}"
        load = [f'base = AutoModelForCausalLM.from_pretrained("{base_ref}", dtype="auto")',
                f'tokenizer = AutoTokenizer.from_pretrained("{here}")',
                f'model = PeftModel.from_pretrained(base, "{here}")']
        imports = ["from peft import PeftModel", "from transformers import AutoModelForCausalLM, AutoTokenizer"]
    return ["```python", *imports, "", *load, "",
            'task = open("my_module.py").read()  # a PyTorch nn.Module named Model, with get_inputs()',
            'request = "Rewrite this PyTorch module with custom Triton kernels as ModelNew:\\n```python\\n" '
            '+ task + "```"',
            'messages = [{"role": "user", "content": request}]',
            'inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",',
            '                                       return_dict=True).to(model.device)',
            "answer = model.generate(**inputs, max_new_tokens=2048)",
            "print(tokenizer.decode(answer[0][inputs[\"input_ids\"].shape[1]:], skip_special_tokens=True))", "```", "",
            "Training and evaluation prompts carried a system prompt and one worked example before the task; with "
            "the training project installed, `extensions.prompting.templates.build_messages(task)` builds exactly those "
            "messages. Run the kernels it writes through a verifier before trusting them."]


# -- the card --------------------------------------------------------------------------------------------
def build_model_card(adapter_dir: Path, *, paths: Optional[RunPaths], repo_id: Optional[str] = None,
                     merged_dtype: Optional[str] = None) -> str:
    """The README.md text for ``adapter_dir`` (its meta.json is read), or, with ``merged_dtype``, for
    the model that adapter was merged into. ``paths``: the run it came from (None: data and
    evaluation are said to be unavailable)."""
    import yaml

    adapter_dir = Path(adapter_dir)
    meta = read_meta(adapter_dir)
    base = base_model_for(str(meta.get("base_model") or (meta.get("model") or {}).get("name_or_path") or ""))
    merged = merged_dtype is not None
    stage = meta.get("stage")
    rl_from_base = stage == "rl" and ((meta.get("config") or {}).get("rl") or {}).get("init") == "base"
    stages = {"sft": ["sft"], "rl": ["rl"] if rl_from_base else ["sft", "rl"]}.get(stage, [])
    header: dict[str, Any] = {}
    if base.hub_id:
        header["base_model"] = base.hub_id
        header["base_model_relation"] = "finetune" if merged else "adapter"
    header["library_name"] = "transformers" if merged else "peft"
    if base.license:
        header["license"] = base.license
    header["pipeline_tag"] = "text-generation"
    tags = list(TAGS) + [{"sft": "sft", "rl": "reinforcement-learning"}[s] for s in stages]
    if base.hub_id:
        tags.insert(0, f"base_model:{'finetune' if merged else 'adapter'}:{base.hub_id}")
    header["tags"] = tags if not merged else [t for t in tags if t != "lora"] + ["merged-lora"]
    title = repo_id.split("/", 1)[1] if repo_id else f"{base.name.rsplit('/', 1)[-1]} Triton kernel writer"
    what = (f"{base.name} with a LoRA adapter merged into its weights ({merged_dtype}; loads without peft)"
            if merged else f"A LoRA adapter for {base.name}")
    stage_words = ", then ".join({"sft": "supervised fine-tuning on verified PyTorch-to-Triton pairs",
                                 "rl": "reinforcement learning with rewards from a sandboxed verifier"}[s]
                                for s in stages) or f"the {stage} stage"
    body = [
        f"# {title}", "",
        f"{what} that writes Triton GPU kernels: given a PyTorch `nn.Module` (KernelBench format), it answers "
        f"with a `ModelNew` that computes the same through custom Triton kernels. Trained by {stage_words}.", "",
        "## Base model", "",
        f"{f'[`{base.hub_id}`](https://huggingface.co/{base.hub_id})' if base.hub_id else f'`{base.name}`'}. "
        f"{base.origin}." + (f" Its licence: {base.license}." if base.license else ""), "",
        "## Training", "", *training_lines(meta, paths), "",
        "## Data", "", *data_lines(paths.prepare_report if paths else None), "",
        "## Verifier", "", *verifier_lines(paths.prepare_report if paths else None), "",
        "## Evaluation", "",
        *evaluation_lines(paths.compare_json if paths else None, adapter_content_hash(adapter_dir)), "",
        "## How to use", "", *usage_lines(base, repo_id, merged), "",
        "## Files", "",
        ("`meta.json` records how this model was made (the resolved config with its fingerprints, the content "
         "hashes of the data it read) and `manifest.json` the size and sha256 of every file."
         if merged else
         # extensions.export.hub leaves the run's records and the resume state out of a published adapter.
         "The adapter (`adapter_config.json`, `adapter_model.safetensors`), the tokenizer and this card. The "
         "run's checkpoint also holds `meta.json` (how the adapter was made: the resolved config with its "
         "fingerprints, the content hashes of the data it read), `manifest.json` (size and sha256 of every "
         "file) and the optimizer and RNG state at the end of training; a copy published to the hub leaves "
         "those out."),
    ]
    front = yaml.safe_dump(header, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return f"---\n{front}---\n\n" + "\n".join(body) + "\n"


def write_model_card(directory: Path, *, adapter_dir: Optional[Path] = None, paths: Optional[RunPaths] = None,
                     repo_id: Optional[str] = None, merged_dtype: Optional[str] = None) -> Path:
    """Write README.md into ``directory`` (replacing PEFT's template): the card of ``adapter_dir``
    (default: ``directory`` itself), or of its merged model with ``merged_dtype``. Call it before
    the directory is finalized, so the manifest lists the card."""
    directory = Path(directory)
    text = build_model_card(adapter_dir or directory, paths=paths, repo_id=repo_id, merged_dtype=merged_dtype)
    atomic_write_text(directory / CARD, text)
    return directory / CARD


def refresh_model_card(directory: Path, *, paths: Optional[RunPaths], repo_id: Optional[str] = None) -> bool:
    """Bring the card of a complete checkpoint up to date before it is published (the repository it
    goes to, an evaluation written since training) and finalize it again; True when it changed. An
    incomplete directory is left alone."""
    directory = Path(directory)
    if not is_complete(directory):
        return False
    text = build_model_card(directory, paths=paths, repo_id=repo_id)
    card = directory / CARD
    if card.is_file() and card.read_text(encoding="utf-8", errors="replace") == text:
        return False
    # Between the new card and the new manifest the directory reads as incomplete: a process dying
    # there leaves rl/final to be copied again from its last round, so no trained weight is lost.
    atomic_write_text(card, text)
    finalize(directory)
    return True
