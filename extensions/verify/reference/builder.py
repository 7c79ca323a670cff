"""The reference builder: one problem's input sets, reference outputs and the slack each output
element earns, packed for the parent (run by ``reference_worker.py``, a trusted process).

Which sets are built, and why a set is left out, is described in ``reference_worker.py``. A set left
out is recorded as a ``SkippedSet`` (its name and the reason): the builder's own fallbacks read the
reason from it, and the parent gets each as one ``name: reason`` line.
"""
from __future__ import annotations

import random
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional

from extensions.timing.tensors import flatten_tensors, map_tensors

from ..common.judged_context import CONTEXTS, OWN_CONTEXT, as_dict, describe, judged_context
from ..common.param_noise import apply_parameter_noise, constant_parameter_keys
from ..common.problem_constants import (find_scalar_constants, find_size_constants, grown_size, is_batch_name,
                                        odd_size, rewrite_constants, shrink_step, varied_scalar, varied_zero)
from ..common.problem_sizes import load_problem, meta_forward_runs, meta_input_numel, meta_numel, numel_of, shrink_to_cap
from ..common.tensor_io import own_copies, own_copy, pack
from .ambiguity import ambiguous_outputs, outputs_off_the_function, step_watch, steps_decided_coarsely
from .tolerances import (ACCUMULATING_OPS, EXACTNESS_MARGIN, OUTLIER_ROUNDING_SLACK, ROUNDING_SLACK,
                         ROUNDING_UNITS, all_finite, capped_slack, like, rms, same_non_finite, scaled_tolerances,
                         toward_exact)
from .variations import (VALUE_VARIATIONS, WITH_ZEROS, between_elements, in_drawn_layouts, in_drawn_storages,
                         in_drawn_structure, integer_operand, integer_transform, is_plain_int, transform_integers,
                         transform_tensors, value_transforms, varied_input_scalar, with_negative_lines, with_offset,
                         with_outliers, with_scalars_varied, with_zeros)

# How far the value sets after ``signed`` move a Python int (``_scalar_plan``), one drawn per batch.
FAR_INT_STEPS = (2, 3)
TIMING_INPUT_SETS = 4  # distinct input sets the timer rotates through (GPU only)
# The wide set may hold this many times the cap's elements: on CPU the interpreter's time grows
# with it; on CUDA its inputs cross the sandbox as files.
WIDE_CAP_MULTIPLE = {"cpu": 4, "cuda": 2}
# aten operators (name parts) that read an integer tensor as places or sizes, not as numbers: an
# integer input that reaches one (itself or anything computed from it) is an index, a class
# target or a size, and keeps the problem's own values (``_integer_plan``). ``_local_scalar_dense``
# is ``.item()``: a number read out to size or loop over something; a shift amount and an exponent
# count steps, as a size does (a kernel may loop that many times).
INDEX_OPS = ("index", "gather", "scatter", "embedding", "take", "nll_loss", "one_hot", "bincount", "put",
             "searchsorted", "bucketize", "repeat_interleave", "histc", "_local_scalar_dense", "multi_margin",
             "multilabel_margin", "ctc_loss", "unique", "shift", "pow")
# Operators that make positions (``arange``), and the comparisons that, between positions and an
# integer input, make it a length (``arange(n) < lengths[:, None]``: a mask, no indexing operator).
POSITION_OPS = ("arange", "range", "tril_indices", "triu_indices")
COMPARISON_OPS = ("lt", "le", "gt", "ge", "eq", "ne", "minimum", "maximum", "clamp", "where")


@dataclass(frozen=True)
class SkippedSet:
    """An input set (or a step of building them) left out, and why: ``name: reason`` to the user."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def same_init(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_init(x, y) for x, y in zip(a, b))
    return a == b


def _same_shapes(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_same_shapes(x, y) for x, y in zip(a, b)))
    return type(a) is type(b)


def _index_watch_class():
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    import torch

    class IndexWatch(TorchDispatchMode):
        """Follows the integer inputs (by storage) through the forward: every operator's outputs
        carry the inputs its arguments came from; ``indices`` holds those that reached an
        ``INDEX_OPS`` operator, or a ``COMPARISON_OPS`` one together with positions (-1 in what
        a tensor carries: made by a ``POSITION_OPS`` operator)."""

        def __init__(self, sources: dict[int, int]):
            super().__init__()
            self.carried: dict[int, set[int]] = {ptr: {i} for ptr, i in sources.items() if ptr}
            self.indices: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            reached: set[int] = set()
            for leaf in tree_leaves((args, kwargs)):
                if isinstance(leaf, torch.Tensor):
                    reached |= self.carried.get(_storage_of(leaf), set())
            out = func(*args, **kwargs)
            name = func.__name__.split(".")[0]
            if name.rstrip("_") in POSITION_OPS:
                reached = reached | {-1}
            if reached:
                inputs = reached - {-1}
                if any(part in name for part in INDEX_OPS):
                    self.indices |= inputs
                elif -1 in reached and name.rstrip("_") in COMPARISON_OPS:
                    self.indices |= inputs
                for leaf in tree_leaves(out):
                    if isinstance(leaf, torch.Tensor) and _storage_of(leaf):
                        self.carried.setdefault(_storage_of(leaf), set()).update(reached)
            return out

    return IndexWatch


def _same_values(a: Any, b: Any) -> bool:
    """Whether two outputs of the same structure hold the same values (NaN where the other has NaN)."""
    import torch

    first, second = flatten_tensors(a), flatten_tensors(b)
    if len(first) != len(second):
        return False
    for x, y in zip(first, second):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            if x != y:
                return False
        elif x.shape != y.shape or x.dtype != y.dtype:
            return False
        elif x.is_floating_point() or x.is_complex():
            if not torch.equal(torch.isnan(x), torch.isnan(y)) or not torch.equal(x.nan_to_num(0.0), y.nan_to_num(0.0)):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def scalar_variation_fault(run: Callable[[], Any], before: Any) -> str:
    """Why a scalar given another value is no valid variation of the problem, or '': ``run`` (the
    reference on the set's inputs with that value) must run, keep the structure and shapes of
    ``before`` (its output with the problem's own value), stay finite where ``before`` is, and give
    the same output when run a second time (a probability of 0.0 made nonzero turns dropout on)."""
    try:
        first = run()
        second = run()
    except Exception as exc:  # noqa: BLE001 - the reference rejects the value
        return f"reference failed ({type(exc).__name__})"
    # Randomness first: a dropout turned on may also, by chance, zero a whole sum and go non-finite,
    # and the reason given should not depend on the draw.
    if not _same_values(first, second):
        return "the reference is not deterministic with it"
    if not _same_shapes(before, first):
        return "the output's shapes changed"
    if all_finite(before) and not all_finite(first):
        return "the output turned non-finite"
    return ""


def _storage_of(tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - a tensor without storage (meta, a subclass)
        return 0


def _index_watch(sources: dict[int, int]):
    """A dispatch mode following the integer inputs (input position by storage address)."""
    return _index_watch_class()(sources)


class ReferenceBuilder:
    def __init__(self, source: str, job: dict, secret: dict):
        import torch

        self.job = job
        self.device = job["device"]
        self.seed = int(job["seed"])  # construction seed: both models are built right after it
        self.input_seed = int(secret["input_seed"])  # drawn per batch, never seen by a candidate
        self.transforms = value_transforms(secret["transforms"])
        # Each top with outliers of both signs, then of the problem's own (a log or a square root
        # of the inputs has no reference for negative ones).
        self.outliers = [(top, either, with_outliers(secret["transforms"], float(top), either))
                         for top in secret["transforms"]["scale_up_tops"] for either in (True, False)]
        self.negative_lines = with_negative_lines(secret["transforms"])
        # The common offset, and half of it where the reference is not exact at the whole.
        self.offsets = (with_offset(secret["transforms"]), with_offset(secret["transforms"], 0.5))
        self.exactness = scaled_tolerances(job["tolerances"], EXACTNESS_MARGIN)
        self.judging = scaled_tolerances(job["tolerances"], 1.0)  # the candidates' own (rounding slack)
        self.fp64_models: dict[int, Any] = {}
        # Per model (init index): whether its forward accumulates (None: no fp64 run on |inputs|).
        self.accumulates: dict[int, bool | None] = {}
        # Per model (init index): whether its forward runs a step function (``ambiguity``), and a
        # copy of it for the perturbed runs (a model with state must not see extra calls).
        self.steps: dict[int, bool] = {}
        self.step_dtypes: dict[int, Any] = {}  # per model: the dtype its steps are decided in
        self.fp32_copies: dict[int, Any] = {}
        self.cap = int(job["max_input_numel"])
        self.original_values = {n: c.value for n, c in find_size_constants(source).items()}
        self.original_source = source
        self.scalar_factor = float(secret["scalar_factor"])
        self.values, self.notes = shrink_to_cap(source, self.cap)
        self.base_source = rewrite_constants(source, self.values)
        self.base = load_problem(self.base_source)
        torch.manual_seed(self.seed)
        init = list(self.base.get_init_inputs())
        torch.manual_seed(self.seed)
        # One (init inputs, model) per distinct constructor arguments; index 0 is the base.
        self.inits: list[list] = [init]
        self.param_seed = int(secret["param_seed"])
        self.param_keys: list[list[str]] = []  # per init index: the constant parameters perturbed
        self.models: list = [self._perturbed(self.base.Model(*init).to(self.device))]
        self.sets: list[dict] = []
        self.base_output_rms = 0.0
        self.base_input_rms = 0.0
        self.skipped_sets: list[SkippedSet] = []
        # Sets the reference failed or overflowed on (a retry under the same name may still add them)
        self.refused: set[str] = set()
        self.integer_inputs = True  # whether the base set has integer tensors to vary (``_integer_plan``)
        self.scalar_positions: set[int] | None = None  # Python scalars of get_inputs to vary (``_scalar_plan``)
        # The value sets after ``signed`` move the Python ints farther (``_scalar_plan``), by a step
        # drawn per batch: with one step for every set, a kernel right for the problem's int and
        # the one next to it (an exponent capped at k + 1) passed.
        self.int_step = random.Random(self.input_seed * 13 + 5).choice(FAR_INT_STEPS)
        self.far_scalar_positions: set[int] = set()
        self.zero_arguments: dict[str, float] | None = None  # constants at 0.0 to vary (``_zero_arguments``)
        self.argument_module: types.ModuleType | None = None  # the base with them varied
        self.base_finite = True  # the base set's output, and whether its inputs hold a float tensor
        self.float_inputs = False
        self.fp16_inputs = False
        self.integers_of_coarse_steps = False  # steps decided in fp16/bf16, an integer or bool output
        # Outputs of the base set with more unsure step elements than the cap (``ambiguity``): a
        # problem undecidable on its own values keeps its varied sets as they are.
        self.base_undecided = 0
        self.tensors: dict[str, Any] = {}
        self.expected: dict[str, Any] = {}

    def skip(self, name: str, reason: str) -> None:
        self.skipped_sets.append(SkippedSet(name, reason))

    @property
    def skipped(self) -> list[str]:
        """Each set left out as the user reads it: ``name: reason``."""
        return [str(entry) for entry in self.skipped_sets]

    def _own_copies(self, values: Any) -> Any:
        """``values`` with each tensor copied to the device in a storage of its own, laid out
        alike: every reference call gets these, so a problem whose forward changes its inputs in
        place (``x += 1``, ``ReLU(inplace=True)``) changes neither the set the candidate is handed
        nor the later calls' inputs (its output would be judged against the changed values).
        Inputs that share a storage share their copy (``own_copies``): a forward that writes into
        one sees the other change, as on the problem's own call."""
        return own_copies(values, self.device)

    def _perturbed(self, model):
        """``model`` with its constant-initialised parameters replaced by the batch's noise
        (``param_noise``); the keys are recorded so the candidate's tensors get the same."""
        keys = constant_parameter_keys(model)
        apply_parameter_noise(model, self.param_seed, keys, reference=True)
        self.param_keys.append(keys)
        return model

    @property
    def init(self) -> list:
        return self.inits[0]

    def module_at(self, values: dict[str, int]) -> types.ModuleType:
        return load_problem(rewrite_constants(self.original_source, values))

    def init_index(self, module: types.ModuleType) -> int:
        """The index of ``module``'s constructor arguments, building its reference model if new."""
        import torch

        torch.manual_seed(self.seed)
        init = list(module.get_init_inputs())
        for index, known in enumerate(self.inits):
            if same_init(known, init):
                return index
        torch.manual_seed(self.seed)
        model = self._perturbed(module.Model(*init).to(self.device))
        self.inits.append(init)
        self.models.append(model)
        return len(self.inits) - 1

    def draw_inputs(self, module: types.ModuleType, seed: int) -> list:
        """``module.get_inputs()`` right after ``seed``. On a GPU its tensors are created there (the
        device made the default for its factory calls): a draw of tens of millions of elements
        takes a tenth of a second on one CPU thread and well under a millisecond on the GPU. A
        problem whose inputs cannot be drawn there draws them on the host as written."""
        import torch

        if self.device != "cpu":
            torch.manual_seed(seed)
            try:
                with torch.device(self.device):
                    return list(module.get_inputs())
            except Exception:  # noqa: BLE001 - drawn on the host below
                pass
        torch.manual_seed(seed)
        return list(module.get_inputs())

    def try_add(self, name: str, kind: str, module, seed: int, transform=None, timing: bool = False,
                exact: bool = False, atol_scale: float | None = None, rounding: float = ROUNDING_SLACK,
                finite: bool = False, decided: bool = False, on_the_function: bool = False,
                off_function_instead: Optional[Callable[[], bool]] = None) -> bool:
        """Add the set ``name``: ``module``'s inputs drawn after ``seed``, passed through
        ``transform`` (the whole input list). A set the reference rejects is left out and listed
        in ``skipped``; with ``exact``, so is one where the fp32 reference strays from its fp64 run;
        with ``decided``, so is one where it cannot decide a step function's output (more unsure
        elements than the cap) but can on the base set; with ``on_the_function``, so is one whose
        output is off the fp64 model at more elements than that cap (``_off_the_function``). Where a
        step function's output is off the fp64 model so and the base set decides its steps,
        ``off_function_instead`` (if given) may add another form of the set in its place (True),
        else this one is added.
        ``atol_scale``: the set's own, where its output's growth would overstate it. Where the
        problem accumulates, each output element's tolerance also has ``_rounding_slack`` (the
        share ``rounding`` of its terms' magnitudes). With ``finite``, a set whose output is not
        all finite is left out (a variation that would leave its set nothing but NaN to compare)."""
        import torch

        try:
            init_index = self.init_index(module)
            inputs = drawn = self.draw_inputs(module, seed)
            if transform is not None:
                inputs = in_drawn_layouts(drawn, in_drawn_structure(drawn, transform(inputs)),
                                          between_elements(drawn, transform))
            with torch.no_grad():
                out = self.models[init_index](*self._own_copies(inputs))
            if self.device != "cpu":
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - the reference rejects this variation
            self.skip(name, f"reference failed ({type(exc).__name__}: {str(exc)[:100]})")
            self.refused.add(name)
            return False
        out_finite = all_finite(out)
        if finite and not out_finite:
            self.skip(name, "reference output not finite")
            return False
        if not out_finite and kind != "base":
            why = self._overflowed(init_index, inputs, out, drawn if transform is not None else None)
            if why:
                self.skip(name, f"reference output not finite ({why})")
                self.refused.add(name)
                return False
        index = len(self.sets)
        # fp32 rounding error grows with the magnitudes involved: on a set whose values the
        # verifier changed, atol grows with the reference output against the base set's (never
        # shrinks below 1). Where the base output is all zero (a ReLU after a subtraction) there
        # is nothing to measure against, and the inputs' growth stands in: a GEMM on inputs x1000
        # differs from another order of summation by ~1e-3 where its output crosses zero.
        if atol_scale is None:
            atol_scale = 1.0 if transform is None else self._growth(inputs, out)
        slack = self._rounding_slack(init_index, inputs, out, rounding, atol_scale)
        if on_the_function and self._off_the_function(init_index, inputs, out, atol_scale, slack):
            self.skip(name, "the fp32 reference is off its fp64 run at more elements than the cap of unsure elements")
            return False
        ambiguous, undecided = self._ambiguous_elements(init_index, inputs, out, atol_scale, slack, index)
        if decided and undecided and not self.base_undecided:
            # The odd-shape set's offset of a hundred deviations puts a step's argument where
            # fp32's rounding is a broad share of a step: a floor of products near 2,000 has steps
            # a correct kernel computed in another order crosses at more elements than any
            # reference can mark as unsure. (Only there: the value sets' signs and magnitudes are
            # what catches a kernel wrong on negatives or large values, and an integer output
            # over the cap on them is the rule, not the exception.)
            self.skip(name, f"the reference cannot decide its steps on these values ({undecided} output(s) over "
                            "the cap of unsure elements, the problem's own values within it)")
            return False
        if (off_function_instead is not None and self.steps.get(init_index) and not self.base_undecided
                and self._off_the_function(init_index, inputs, out, atol_scale, slack) and off_function_instead()):
            return True
        if exact:
            why = self._inexact(init_index, inputs, out, atol_scale, slack, ambiguous)
            if why:
                self.skip(name, why)
                return False
        # After the exactness check: that check asks how far the reference is off its fp64 run.
        toward = self._toward_exact(init_index, inputs, out, atol_scale)
        if kind == "base":
            self.base_undecided = undecided
            self.base_output_rms, self.base_input_rms = rms(out), rms(inputs)
            self.base_finite = out_finite
            self.float_inputs = any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in inputs)
            self.fp16_inputs = any(isinstance(v, torch.Tensor) and v.dtype == torch.float16 for v in inputs)
            self.integers_of_coarse_steps = (steps_decided_coarsely(self.step_dtypes.get(init_index), inputs)
                                             and any(not t.is_floating_point() for t in flatten_tensors(out)))
            self.integer_inputs = any(integer_operand(value) for value in inputs)
        self.sets.append({
            "name": name, "kind": kind, "timing": timing, "atol_scale": atol_scale, "init": init_index,
            "numel": numel_of(inputs),
            "inputs": pack(inputs, f"s{index}.in", self.tensors, layouts=True),
            "expected": pack(out, f"s{index}.out", self.expected),
        })
        if slack is not None:
            self.sets[-1]["slack"] = pack(slack, f"s{index}.slack", self.expected)
        if toward is not None:
            self.sets[-1]["toward"] = pack(toward, f"s{index}.toward", self.expected)
        if ambiguous is not None:
            self.sets[-1]["ambiguous"] = pack(ambiguous, f"s{index}.ambiguous", self.expected)
        return True

    @property
    def unanswered(self) -> list[str]:
        """The sets left out because the reference had no answer on them: their checks did not run
        (a variation the problem has no room for, or a fallback that ran instead, is not one)."""
        return sorted(self.refused - {s["name"] for s in self.sets})

    def _growth(self, inputs: list, out: Any) -> float:
        if self.base_output_rms:
            grown = rms(out) / self.base_output_rms
        else:
            grown = rms(inputs) / self.base_input_rms if self.base_input_rms else 1.0
        return max(1.0, grown)

    def build(self) -> None:
        job = self.job
        seed = self.input_seed
        if job["tiny_first"]:
            batch = {n: min(v, 2) for n, v in self.values.items() if is_batch_name(n) and v > 2}
            module = self.module_at({**self.values, **batch}) if batch else None
            if module is None or not self.try_add("tiny", "tiny", module, seed):
                self.try_add("tiny", "tiny", self.base, seed + 1000)
        full_before = len(self.sets)
        if not self.try_add("base", "base", self.base, seed, timing=True):
            raise RuntimeError(str(self.skipped_sets[-1]))
        wanted = max(1, int(job["num_tests"])) if job["multi_input"] else 1
        values = list(VALUE_VARIATIONS) if job["multi_input"] and job["value_variations"] else []
        variations = values[:1]
        if job["multi_input"] and job["shape_variations"]:
            variations.append("shape")
        variations += values[1:]
        seed += 1
        for variation in variations:
            if len(self.sets) - full_before >= wanted:
                break
            if variation == "shape":
                self._add_shape_variation(seed)
            else:
                self._add_value_set(variation, seed)
            seed += 1
        first_seed = self.input_seed
        while job["multi_input"] and len(self.sets) - full_before < wanted and seed < first_seed + 50:
            self.try_add(f"seed_{seed - first_seed}", "seed", self.base, seed, timing=True)
            seed += 1
        # Timing rotates through several distinct sets so a memoising candidate gains nothing.
        timed = sum(1 for s in self.sets if s["timing"])
        while self.device != "cpu" and timed < TIMING_INPUT_SETS and seed < first_seed + 50:
            timed += self.try_add(f"seed_{seed - first_seed}", "seed", self.base, seed, timing=True)
            seed += 1
        if job["multi_input"] and job["shape_variations"]:
            self._add_wide_set(seed)
        self._assign_contexts()

    def _assign_contexts(self) -> None:
        """The sets called in another context than the harness's own (``judged_context``: eval
        mode, grad on): every context of ``CONTEXTS`` once, where there are sets enough, and each
        further set in one drawn from those and the harness's own, on sets in an order drawn per
        batch. A kernel wrong in one context on some inputs only (a ReLU that copies its input in
        eval mode is wrong on negative values alone) meets that context on the sets that show it
        in a share of batches, not in every one. Never ``tiny`` (the funnel's partial credit
        stays a verdict on the harness's own call), the base (timed, run twice on CUDA, the
        problem's own call), the wide set or a timed one (their size, on CUDA, leaves no room for
        autograd's saved tensors)."""
        eligible = [i for i, s in enumerate(self.sets)
                    if s["kind"] not in ("tiny", "base", "wide") and not s["timing"]]
        rng = random.Random(self.input_seed * 31 + 17)
        rng.shuffle(eligible)
        contexts = list(CONTEXTS)
        rng.shuffle(contexts)
        contexts += [rng.choice(CONTEXTS + (OWN_CONTEXT,)) for _ in eligible[len(contexts):]]
        for index, context in zip(eligible, contexts):
            if context != OWN_CONTEXT:
                self._judge_in_context(index, *context)

    def _judge_in_context(self, index: int, eval_mode: bool, grad: bool, inference: bool = False) -> None:
        """Set ``index`` called in eval mode, with grad on and/or in inference mode, where the reference in that
        context (its model called once more: one with state that changes per call does not
        match, and the set keeps the harness's own context) matches its own output within
        ``EXACTNESS_MARGIN`` of the set's tolerances; its expected output is then the
        reference's in that context. Eval mode changes what BatchNorm and dropout compute, and
        a kernel that ignores the mode is right for the problem as the harness defines it (every
        module in training mode, as constructed): where the mode changes the output, the set is
        called with grad on alone. Grad mode changes no value PyTorch computes."""
        from ..common.compare import compare_outputs
        from ..common.tensor_io import unpack

        entry = self.sets[index]
        inputs = unpack(entry["inputs"], self.tensors, layouts=True)
        expected = unpack(entry["expected"], self.expected)
        slack = unpack(entry["slack"], self.expected) if "slack" in entry else None
        ambiguous = unpack(entry["ambiguous"], self.expected) if "ambiguous" in entry else None
        margin = map_tensors(slack, lambda t: t * EXACTNESS_MARGIN) if slack is not None else None
        # Where eval mode changes the output, the set keeps the rest of its context in training
        # mode (grad on when there is nothing else left to judge).
        tries = [(eval_mode, grad, inference)] + ([(False, grad or not inference, inference)] if eval_mode else [])
        for attempt in tries:
            context = as_dict(attempt)
            try:
                out = self._context_run(int(entry["init"]), inputs, context)
            except Exception as exc:  # noqa: BLE001 - the set keeps the harness's own context
                self.skip("judged context", f"{entry['name']}: {describe(context)} not used "
                          f"(reference failed: {type(exc).__name__})")
                continue
            mismatch = compare_outputs(out, expected, self.exactness, atol_scale=entry["atol_scale"],
                                       slack=margin, ambiguous=ambiguous)
            if mismatch is not None:
                self.skip("judged context", f"{entry['name']}: {describe(context)} not used (the reference's "
                          f"output changes with it: {mismatch.reason})")
                continue
            for key in [k for k in self.expected if k == f"s{index}.out" or k.startswith(f"s{index}.out.")]:
                del self.expected[key]
            entry["expected"] = pack(out, f"s{index}.out", self.expected)
            entry["context"] = context
            return

    def _context_run(self, init_index: int, inputs: list, context: dict) -> Any:
        """The model of ``init_index`` called on ``inputs`` in ``context``. Every set is built by
        then, so the call changes no set's output, and no copy of a large model is held."""
        model = self.models[init_index]
        with judged_context(model, context):
            out = model(*self._own_copies(inputs))
        if self.device != "cpu":
            import torch

            torch.cuda.synchronize()
        # On the host, as every set's expected output is kept (``pack``): compared with one, it
        # may replace it.
        return map_tensors(out, lambda t: t.detach().cpu())

    def _add_value_set(self, variation: str, seed: int) -> None:
        """One value variation (never timed: speed is measured on the problem's own values), with
        exact zeros and the Python float inputs varied too, and the Python ints and zeros the
        reference takes (``_scalar_plan``, ``_zero_arguments``); where the reference rejects those
        (a division by an input, a probability above 1), the tensors' transform alone. Integer inputs
        that are numbers, not places (``_integer_plan``), get signs and, in ``scale_up``, large
        magnitudes; where no form of the set runs with them, it is built with them as drawn."""
        positions, integer_fn = self._integer_plan(variation, seed)
        self._scalar_plan(seed)
        if self._add_values(variation, seed, positions, integer_fn) or not positions:
            return
        self.skip(f"{variation} integers", f"inputs {sorted(positions)} kept as drawn (the set failed with them varied)")
        self._add_values(variation, seed, set(), None)

    def _add_values(self, variation: str, seed: int, positions: set[int], integer_fn) -> bool:
        """``_add_value_set`` with the integer inputs at ``positions`` passed through ``integer_fn``."""
        fn = self.transforms[variation]

        def integers(inputs: list) -> list:
            return transform_integers(inputs, integer_fn, positions) if positions else inputs

        def everything(tensor_fn, zeros: bool = True) -> Callable:
            def transform(inputs: list) -> list:
                varied = transform_tensors(inputs, tensor_fn)
                if zeros and variation in WITH_ZEROS:
                    varied = transform_tensors(varied, with_zeros)
                positions, step = self._scalars_for(variation)
                return with_scalars_varied(integers(varied), self.scalar_factor, positions, step)
            return transform

        if variation == "scale_up":
            # Highest top first; each kept only where the fp32 reference is still exact there (a
            # sum of squares overflows, a sum of outliers of both signs cancels): otherwise the
            # uniform factor. atol stays the base set's: all but the outliers are the problem's
            # own values, and a set-wide scale grown with the outliers would let a kernel wrong on
            # the values between (a ReLU that returns 0 between 3.5 and 7) pass; outliers are
            # held to rtol.
            reasons = []
            for top, either, outliers in self.outliers:
                label = f"1e{top:.1f}{' either sign' if either else ''}"
                if self.try_add(variation, "values", self.base, seed,
                                lambda inputs, outliers=outliers: integers(transform_tensors(inputs, outliers)),
                                exact=True, atol_scale=1.0, rounding=OUTLIER_ROUNDING_SLACK):
                    self.sets[-1]["spread_top"] = round(top, 2)
                    self.sets[-1]["outlier_signs"] = "either" if either else "own"
                    self._note_integers(positions)
                    return True
                reasons.append(f"{label}: {self.skipped_sets.pop().reason}")
            self.skip(variation, f"one factor for every element (outliers {'; '.join(reasons)})")
        if variation == "shift":
            # Kept only where the fp32 reference is exact with lines far from the rest (a GEMM's
            # sum of a line of -1000s and the problem's values cancels): otherwise every
            # element shifted, as one peek can tell.
            if self.try_add(variation, "values", self._value_module(), seed, everything(self.negative_lines),
                            exact=True, rounding=OUTLIER_ROUNDING_SLACK):
                self.sets[-1]["negative_lines"] = True
                self._note_scalars(variation)
                return True
            why = self.skipped_sets.pop().reason
            self.skip(variation, f"every element shifted (lines: {why})")
        # fp16 has 5 exponent bits: scaled down by 1e-3 its values reach the subnormals, where each
        # op of the reference rounds to a fixed 6e-8 and strays from the function by percents (a
        # product of two such inputs 1.7% at 1e-3, 17% at 1e-3.5), beyond what a correct kernel
        # computing wider can match. Kept there only where the reference is still exact.
        # The same for every set of integers decided in fp16/bf16 (a floor cast to long, a
        # comparison): the values moved to larger magnitudes round by more than a step, and the
        # reference's integers leave the function's on a broad share of the output, which no
        # tolerance covers and a kernel computing wider cannot match.
        exact = (variation == "scale_down" and self.fp16_inputs) or self.integers_of_coarse_steps

        def without_zeros() -> bool:
            # The injected zeros are one input value repeated in a sixteenth of the places: where
            # the function's value there sits on a step in fp32 (``floor((x - 0.3) * 50)`` is -16
            # at x = 0 in the fp32 reference, -15 in the fp64 model and in ``x * 50 - 15``), every
            # such place is off the function, and no perturbation (relative: a zero stays zero)
            # marks one as unsure: a correct kernel was rejected at all of them. The set without
            # its zeros is kept where the reference then stays on its fp64 run but at a few
            # elements (the cap of unsure ones); where it does not either, it is the magnitudes,
            # and the set is kept with its zeros as before.
            if self.try_add(variation, "values", self._value_module(), seed, everything(fn, zeros=False),
                            exact=exact, on_the_function=True):
                self.skip(f"{variation} zeros", "left out: with them the fp32 reference is off its steps, without them not")
                return True
            self.skipped_sets.pop()
            return False

        if self.try_add(variation, "values", self._value_module(), seed, everything(fn), exact=exact,
                        off_function_instead=without_zeros if variation in WITH_ZEROS else None):
            self._note_integers(positions)
            self._note_scalars(variation)
            return True
        why = self.skipped_sets.pop().reason
        if self.try_add(variation, "values", self.base, seed, lambda inputs: integers(transform_tensors(inputs, fn)),
                        exact=exact):
            self._note_integers(positions)
            self.skip(variation, f"without exact zeros and varied float inputs ({why})")
            return True
        return False

    def _note_integers(self, positions: set[int]) -> None:
        if positions:
            self.sets[-1]["integers_varied"] = sorted(positions)

    def _scalars_for(self, variation: str) -> tuple[set[int], int]:
        """The Python scalars value set ``variation`` moves, and the step its ints move by: one
        in ``signed``, ``int_step`` in the others."""
        if variation == "signed":
            return self.scalar_positions or set(), 1
        return self.far_scalar_positions, self.int_step

    def _note_scalars(self, variation: str) -> None:
        positions, step = self._scalars_for(variation)
        if positions:
            self.sets[-1]["scalars_varied"] = sorted(positions)
            self.sets[-1]["int_step"] = step
        if self.sets[-1]["init"] != 0 and self.zero_arguments:
            self.sets[-1]["arguments_varied"] = sorted(self.zero_arguments)

    def _value_module(self) -> types.ModuleType:
        """The problem at the base's sizes with its constants at 0.0 that reach the constructor
        varied (``_zero_arguments``), for the value sets that vary the Python scalars: the shape
        set varies them too, but its common offset can push every input past a clamp's bounds,
        where a bound written in as 0.0 gives the right answer. The base where there is none."""
        if self.argument_module is None:
            zeros = self._zero_arguments()
            self.argument_module = self.base
            if zeros:
                try:
                    self.argument_module = self.module_at({**self.values, **zeros})
                except Exception as exc:  # noqa: BLE001 - the base's module instead
                    self.skip("constructor arguments", f"zeros kept (problem failed to load: {type(exc).__name__})")
        return self.argument_module

    def _zero_arguments(self) -> dict[str, float]:
        """The module constants equal to 0.0 that reach ``get_init_inputs()`` and may take
        ``varied_zero``'s value: each alone, the reference built with it must pass
        ``_zero_argument_fault`` on the base set's sizes and draw. Decided once."""
        import torch

        if self.zero_arguments is not None:
            return self.zero_arguments
        self.zero_arguments = {}
        zeros = [n for n, v in find_scalar_constants(self.original_source).items() if v == 0.0]
        if not zeros:
            return self.zero_arguments

        def init_of(values: dict) -> list:
            torch.manual_seed(self.seed)
            return list(self.module_at(values).get_init_inputs())

        other = varied_zero(self.scalar_factor)
        try:
            base = init_of(self.values)
        except Exception as exc:  # noqa: BLE001 - nothing to compare with
            self.skip("constructor arguments", f"zeros kept ({type(exc).__name__})")
            return self.zero_arguments
        for name in zeros:
            try:
                reaches = not same_init(base, init_of({**self.values, name: other}))
            except Exception as exc:  # noqa: BLE001 - the problem rejects the value
                self.skip("constructor arguments", f"{name} kept at 0.0 (problem failed: {type(exc).__name__})")
                continue
            if not reaches:
                continue  # never reaches the constructor
            why = self._zero_argument_fault(name, other)
            if why:
                self.skip("constructor arguments", f"{name} kept at 0.0 ({why})")
            else:
                self.zero_arguments[name] = other
        return self.zero_arguments

    def _scalar_plan(self, seed: int) -> set[int]:
        """The Python scalars of ``get_inputs()`` that the value sets give other values besides the
        nonzero floats (which ``varied_scalar`` always moves): ints (``varied_int``) and floats
        equal to 0.0 (``varied_zero``). Each is tried alone on the set's draw with a copy of the
        base model (``scalar_variation_fault``); one the reference cannot take keeps the
        problem's value, noted in ``skipped``: an axis or a size (the output's shape changes), a
        probability (the output is random), a value outside the problem's domain (it fails or
        turns non-finite). An int is tried one step away from zero (``signed``) and ``int_step``
        away (the other value sets, ``far_scalar_positions``), each value alone. Decided once, on
        the first value set's draw."""
        if self.scalar_positions is not None:
            return self.scalar_positions
        self.scalar_positions = set()
        inputs = self.draw_inputs(self.base, seed)
        candidates = [i for i, v in enumerate(inputs)
                      if is_plain_int(v) or (isinstance(v, float) and v == 0.0)]
        if not candidates:
            return self.scalar_positions
        try:
            before = self._fp32_rerun(0, inputs)
        except Exception:  # noqa: BLE001 - the set itself will say why
            return self.scalar_positions
        for i in candidates:
            for step, kept in ((1, self.scalar_positions), (self.int_step, self.far_scalar_positions)):
                if step != 1 and (i not in self.scalar_positions or not is_plain_int(inputs[i])):
                    if i in self.scalar_positions:  # a zero's value does not depend on the step
                        kept.add(i)
                    break
                trial = list(inputs)
                trial[i] = varied_input_scalar(inputs[i], self.scalar_factor, step)
                why = scalar_variation_fault(lambda trial=trial: self._fp32_rerun(0, trial), before)
                if why:
                    where = "" if step == 1 else f" in the sets that move it by {step}"
                    self.skip("scalar inputs", f"input {i} kept at {inputs[i]!r}{where} ({why})")
                    break
                kept.add(i)
        return self.scalar_positions

    def _integer_plan(self, variation: str, seed: int) -> tuple[set[int], Any]:
        """The integer inputs ``variation`` may vary (``variations.integer_transform``), and the
        transform: each signed integer tensor of the set's draw that is a number the problem
        computes with. One is kept as drawn, and noted in ``skipped``, where it (or anything
        computed from it) reaches an ``INDEX_OPS`` operator (an index, a class target, a size
        read with ``.item()``), or where the reference, given it varied alone, fails, changes its
        output's structure or shapes, or turns a finite output non-finite. The runs use a copy
        of the base model (one with state must not see extra calls)."""
        import copy

        import torch

        fn = integer_transform(variation)
        if fn is None or not self.integer_inputs:
            return set(), None
        inputs = self.draw_inputs(self.base, seed)
        candidates = [i for i, value in enumerate(inputs) if integer_operand(value)]
        if not candidates:
            return set(), None
        if 0 not in self.fp32_copies:
            self.fp32_copies[0] = copy.deepcopy(self.models[0])
        model = self.fp32_copies[0]

        here = self._own_copies(inputs)
        watch = _index_watch({here[i].untyped_storage().data_ptr(): i for i in candidates})
        try:
            with torch.no_grad(), watch:
                before = model(*here)
        except Exception:  # noqa: BLE001 - the set itself will say why
            return set(), None
        kept: set[int] = set()
        for i in candidates:
            why = ""
            if i in watch.indices:
                why = "an index, a class target or a size"
            else:
                trial = in_drawn_storages(inputs, [fn(v) if j == i else v for j, v in enumerate(inputs)])
                try:
                    with torch.no_grad():
                        after = model(*self._own_copies(trial))
                except Exception as exc:  # noqa: BLE001 - the problem's reference rejects such values
                    why = f"reference failed ({type(exc).__name__})"
                else:
                    if not _same_shapes(before, after):
                        why = "the output's shapes changed"
                    elif all_finite(before) and not all_finite(after):
                        why = "the output turned non-finite"
            if why:
                self.skip(f"{variation} integers", f"input {i} kept as drawn ({why})")
            else:
                kept.add(i)
        return kept, fn

    def model_bytes(self) -> int:
        """The largest reference model's parameters and buffers: a worker builds the model on the
        host before it moves it, and the candidate's is about as large (its memory cap allows for both)."""
        return max((sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
                    for model in self.models), default=0)

    def _fp64(self, init_index: int, inputs: list, magnitudes: bool = False) -> Any:
        """The model of ``init_index`` run in fp64 on ``inputs`` (their absolute values with
        ``magnitudes``); raises what the model raises."""
        import copy

        import torch

        if init_index not in self.fp64_models:
            self.fp64_models[init_index] = copy.deepcopy(self.models[init_index]).double()

        def widen(t):
            if not t.is_floating_point():
                return own_copy(t, self.device)
            t = t.to(torch.float64, copy=True)
            return (t.abs() if magnitudes else t).to(self.device)

        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)  # tensors the forward creates match its inputs
        try:
            with torch.no_grad():
                return self.fp64_models[init_index](*own_copies(inputs, convert=widen))
        finally:
            torch.set_default_dtype(default)

    def _rounding_slack(self, init_index: int, varied: list, out: Any, share: float, atol_scale: float) -> Any:
        """``share`` times the fp64 model on |varied|, capped (``CANCELLATION_CAP``), where
        the model runs an ``ACCUMULATING_OPS`` operator; None where it runs none, where it
        cannot run in fp64 on |varied| (noted once per model in ``skipped``), or where the slack
        is negligible against the tolerance (atol times ``atol_scale``) on every output."""
        from torch.utils._python_dispatch import TorchDispatchMode

        from ..common.compare import tolerances

        if self.accumulates.get(init_index) is False:
            return None

        class Accumulations(TorchDispatchMode):
            seen = False

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.seen = self.seen or any(part in func.__name__.split(".")[0] for part in ACCUMULATING_OPS)
                return func(*args, **(kwargs or {}))

        accumulations = Accumulations()
        try:
            with accumulations:
                magnitudes = like(self._fp64(init_index, varied, True), out)
        except Exception as exc:  # noqa: BLE001 - an op without fp64, or a model that rejects |inputs|
            if init_index not in self.accumulates:
                self.skip("rounding slack", f"no fp64 run on |inputs| ({type(exc).__name__})")
            self.accumulates[init_index] = None
            return None
        self.accumulates[init_index] = accumulations.seen
        if not accumulations.seen:
            return None
        pieces = iter(flatten_tensors(magnitudes))
        del magnitudes

        def slack_of(o):
            atol, rtol = tolerances(str(o.dtype).rsplit(".", 1)[-1], self.judging)
            return capped_slack(next(pieces), o, share, atol * atol_scale, rtol)

        slack = map_tensors(out, slack_of)
        return slack if flatten_tensors(slack) else None

    def _toward_exact(self, init_index: int, inputs: list, out: Any, atol_scale: float) -> Any:
        """Per floating-point output of a set that computes in fp16/bf16 (an output or an input
        in that precision: ``sigmoid(x * y).float()`` rounds each step to fp16 before its fp32
        output), the signed step from the reference to its fp64 run (``tolerances.toward_exact``);
        None where there is none worth keeping. Not where the model runs a step function: there
        an element the fp64 run decides otherwise is marked ambiguous, with both answers,
        instead; nor where the model cannot run in fp64."""
        import torch

        from ..common.compare import tolerances

        low = (torch.float16, torch.bfloat16)
        outputs = flatten_tensors(out)
        low_inputs = any(isinstance(t, torch.Tensor) and t.dtype in low for t in flatten_tensors(inputs))
        if self.steps.get(init_index) or not (low_inputs or any(t.dtype in low for t in outputs)):
            return None
        try:
            exact = flatten_tensors(self._fp64(init_index, inputs))
            reach = self._rounding_reach(init_index, inputs)
        except Exception:  # noqa: BLE001 - an op without fp64: the tolerance alone, as before
            return None
        if len(exact) != len(outputs) or not reach:
            return None
        pieces = iter(exact)

        def step_of(o):
            wide = next(pieces)
            if not o.is_floating_point() or wide.shape != o.shape:
                return None
            atol, rtol = tolerances(str(o.dtype).rsplit(".", 1)[-1], self.judging)
            return toward_exact(o, wide, atol * atol_scale, rtol, reach)


        toward = map_tensors(out, step_of)
        return toward if flatten_tensors(toward) else None

    def _rounding_reach(self, init_index: int, inputs: list) -> float:
        """How far the reference's rounding can move an output on ``inputs``: ``ROUNDING_UNITS``
        of the coarsest low-precision eps at the largest finite magnitude among the inputs and
        every floating-point value the forward computes (seen by a dispatch mode on a rerun of
        the model, as a copy); 0 where it computes nothing in fp16/bf16."""
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        low = (torch.float16, torch.bfloat16)
        largest: list = []
        eps = [0.0]

        def note(value) -> None:
            for t in flatten_tensors(value if isinstance(value, (list, tuple)) else [value]):
                if t.is_floating_point() and t.numel():
                    if t.dtype in low:
                        eps[0] = max(eps[0], torch.finfo(t.dtype).eps)
                    largest.append(t.detach().abs().nan_to_num(nan=0.0, posinf=0.0).amax().float())

        class Magnitudes(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                note(out)
                return out

        note(list(inputs))
        with Magnitudes():
            self._fp32_rerun(init_index, inputs)
        if not eps[0] or not largest:
            return 0.0
        return ROUNDING_UNITS * eps[0] * float(torch.stack([v.to(largest[0].device) for v in largest]).max())

    def _ambiguous_elements(self, init_index: int, inputs: list, out: Any, atol_scale: float, slack: Any,
                            index: int) -> tuple[Any, int]:
        """The output elements the reference cannot decide, with the values it gave there
        (``ambiguity.ambiguous_outputs``), where the model runs a step function; else None. Also
        how many outputs had more such elements than the cap. The perturbations are drawn from
        the batch's secret input seed."""
        import copy

        import torch

        if self.steps.get(init_index) is False:
            return None, 0

        # The perturbed inputs are new tensors each: those the set has in one storage are put back
        # in one (``in_drawn_storages``), so a forward that writes into one input sees the other change.
        def rerun(varied: list) -> Any:
            if init_index not in self.fp32_copies:
                self.fp32_copies[init_index] = copy.deepcopy(self.models[init_index])
            with torch.no_grad():
                return self.fp32_copies[init_index](*self._own_copies(in_drawn_storages(inputs, varied)))

        watch = step_watch()
        try:
            with watch:
                wide = like(self._fp64(init_index, inputs), out)
        except Exception:  # noqa: BLE001 - no fp64 alternative; the perturbed runs still decide
            wide = None
        if init_index not in self.steps:
            if not watch.seen and wide is None:  # the fp64 run failed: watch the fp32 model instead
                watch = step_watch()
                try:
                    with watch:
                        rerun(inputs)
                except Exception:  # noqa: BLE001 - the perturbed runs below would fail the same way
                    pass
            self.steps[init_index] = watch.seen
            self.step_dtypes[init_index] = watch.coarsest
        if not self.steps[init_index]:
            return None, 0

        def rerun_wide(varied: list) -> Any:
            return like(self._fp64(init_index, in_drawn_storages(inputs, varied)), out)

        try:
            return ambiguous_outputs(out, rerun, inputs, wide, self.input_seed + 7919 * (index + 1), self.judging,
                                     atol_scale, slack, rerun_wide if wide is not None else None,
                                     self.step_dtypes.get(init_index))
        except Exception as exc:  # noqa: BLE001 - a model that rejects perturbed inputs: compared as before
            self.skip("ambiguous elements", f"perturbed reference failed ({type(exc).__name__})")
            return None, 0

    def _overflowed(self, init_index: int, inputs: list, out: Any, drawn: list | None = None) -> str:
        """Why the non-finite values of the fp32 reference output ``out`` are not the function's own
        (fp32 overflow or a precision accident, which a correct kernel need not repeat), or ''.
        ``drawn``: the set's inputs before its value transform (None: the problem's own values).

        A masked softmax's -inf, a log of zero or of a negative number are non-finite in fp64 at the
        same places: such a set is kept and compared by position (``compare``: NaN, +inf and -inf
        exactly where the reference has them). Skipping it instead left masked problems with the
        base set only, where kernels that overflow or assume a row length passed.

        Where the model cannot run in fp64 (a cast or a dtype fixed inside its forward), a set of
        the problem's own values (another seed, shape or size) is kept as the base set is, and a
        transformed one where its non-finite values are exactly those of the same draw without
        the transform (a mask's -inf at the mask's places): the transform made nothing overflow.
        Without that, a masked attention that casts its inputs was judged on its base set alone."""
        try:
            wide = self._fp64(init_index, inputs)
        except Exception as exc:  # noqa: BLE001 - an op without fp64: the fp32 model on the draw decides
            why = f"no fp64 run to tell overflow from the function's own ({type(exc).__name__})"
            if drawn is None:
                return ""
            try:
                plain = self._fp32_rerun(init_index, drawn)
            except Exception:  # noqa: BLE001 - the draw itself fails: nothing to compare with
                return why
            return "" if same_non_finite(out, plain) else f"{why}; the transform made other values non-finite"
        return "" if same_non_finite(out, wide) else "fp32 overflow: the fp64 run differs in where it is not finite"

    def _fp32_rerun(self, init_index: int, inputs: list) -> Any:
        """The model of ``init_index`` run again on ``inputs``, as a copy (one with state must not
        see extra calls)."""
        import copy

        import torch

        if init_index not in self.fp32_copies:
            self.fp32_copies[init_index] = copy.deepcopy(self.models[init_index])
        with torch.no_grad():
            return self.fp32_copies[init_index](*self._own_copies(inputs))

    def _off_the_function(self, init_index: int, inputs: list, out: Any, atol_scale: float, slack: Any) -> int:
        """How many outputs of the fp32 reference lie off the fp64 model at more elements than the
        cap of unsure elements (``ambiguity.outputs_off_the_function``); 0 without an fp64 run."""
        try:
            wide = like(self._fp64(init_index, inputs), out)
        except Exception:  # noqa: BLE001 - an op without fp64, or another structure: nothing to count
            return 0
        coarse = steps_decided_coarsely(self.step_dtypes.get(init_index), inputs)
        return outputs_off_the_function(out, wide, self.judging, atol_scale, slack, coarse=coarse)

    def _inexact(self, init_index: int, inputs: list, out: Any, atol_scale: float, slack: Any = None,
                 ambiguous: Any = None) -> str:
        """Why the fp32 reference output ``out`` is not exact enough on ``inputs`` (judged against
        the same model run in fp64 with ``EXACTNESS_MARGIN`` of the tolerances and of ``slack``), or ''.
        At the ``ambiguous`` elements (``ambiguity``) either answer is the reference's own."""
        from ..common.compare import compare_outputs

        try:
            exact = self._fp64(init_index, inputs)
        except Exception as exc:  # noqa: BLE001 - an op without fp64: no outliers
            return f"no fp64 reference ({type(exc).__name__})"
        try:
            exact = like(exact, out)
        except (TypeError, ValueError) as exc:
            return f"fp64 reference differs in structure ({exc})"
        margin = map_tensors(slack, lambda t: t * EXACTNESS_MARGIN) if slack is not None else None
        mismatch = compare_outputs(out, exact, self.exactness, atol_scale=atol_scale, slack=margin,
                                   ambiguous=ambiguous)
        return f"fp32 reference off its fp64 run ({mismatch.reason})" if mismatch else ""

    def _constructor_arguments(self) -> dict[str, float | int]:
        """Constants that reach ``get_init_inputs()`` at other values: floats (a multiplier, a
        slope, clamp bounds; ``varied_scalar``), floats equal to 0.0 (``varied_zero``) and
        integers below 4, which the odd sizes leave alone (kernel sizes, strides, paddings,
        dilations: one step away from zero). A kernel that writes the problem's values in instead
        of reading its constructor's arguments is right at those values only. Each change is kept
        only if the problem still runs on the meta device with the ones kept before it; a zero
        also only where the reference with it alone runs on the base set's draw, keeps its
        output's shapes, stays finite and gives the same output twice (``_zero_argument_fault``:
        a dropout probability of 0.0 stays 0.0)."""
        import torch

        def init_of(values: dict) -> list:
            torch.manual_seed(self.seed)
            return list(self.module_at(values).get_init_inputs())

        scalars = find_scalar_constants(self.original_source)
        # Floats equal to 0.0 only where the reference, run with the new value, stays valid
        # (``_zero_argument_fault``): a zero may be a disabled option (a dropout probability).
        changes = [(n, varied_scalar(v, self.scalar_factor) if v != 0.0 else varied_zero(self.scalar_factor))
                   for n, v in scalars.items()]
        # Not an axis (``dim``, ``axis``): a kernel tiled for the problem's axis is right on
        # another but can be many times slower in the CPU interpreter, past its time limit.
        changes += [(n, v + 1 if v >= 0 else v - 1) for n, v in self.values.items()
                    if -4 < v < 4 and not any(word in n.lower() for word in ("dim", "axis"))]
        varied: dict = {}
        try:
            base = init_of(self.values)
            check_meta = meta_forward_runs(rewrite_constants(self.original_source, self.values))
            for name, other in changes:
                trial = {**self.values, **varied, name: other}
                if same_init(base, init_of({**self.values, name: other})):
                    continue  # never reaches the constructor
                if check_meta and not meta_forward_runs(rewrite_constants(self.original_source, trial)):
                    continue
                if scalars.get(name) == 0.0 and name not in self._zero_arguments():
                    continue
                varied[name] = other
        except Exception as exc:  # noqa: BLE001 - the problem rejects a value: keep what was kept
            self.skip("constructor arguments", type(exc).__name__)
        return varied

    def _zero_argument_fault(self, name: str, other: float) -> str:
        """Why the module constant ``name`` (0.0 in the problem) cannot reach the constructor as
        ``other``, or '' (``scalar_variation_fault``): a fresh reference model with it, on the base
        set's sizes and draw, against the base model on that draw."""
        import torch

        try:
            module = self.module_at({**self.values, name: other})
            torch.manual_seed(self.seed)
            init = list(module.get_init_inputs())
            torch.manual_seed(self.seed)
            model = module.Model(*init).to(self.device)
        except Exception as exc:  # noqa: BLE001 - the problem rejects the value
            return f"reference failed ({type(exc).__name__})"
        inputs = self.draw_inputs(self.base, self.input_seed)
        try:
            before = self._fp32_rerun(0, inputs)
        except Exception as exc:  # noqa: BLE001 - nothing to compare with
            return f"base reference failed ({type(exc).__name__})"

        def run() -> Any:
            with torch.no_grad():
                return model(*self._own_copies(inputs))

        return scalar_variation_fault(run, before)

    def _add_shape_variation(self, seed: int) -> None:
        eligible = {n: odd_size(v) for n, v in self.values.items() if v >= 4 and odd_size(v) != v}
        attempts = [eligible] + [{n: v} for n, v in eligible.items()] if eligible else []
        arguments = self._constructor_arguments()
        if arguments:
            attempts.insert(0, {**eligible, **arguments})
        # The first attempt's inputs also get a common offset (``variations.with_offset``) where the
        # fp32 reference stays exact with it and, if the base output is finite, finite.
        offset = self.float_inputs
        for changed in attempts[:6]:
            try:
                module = self.module_at({**self.values, **changed})
            except Exception as exc:  # noqa: BLE001
                self.skip(f"shape {changed}", f"problem failed to load ({type(exc).__name__})")
                continue
            label = "_".join(f"{n}{v:g}" if isinstance(v, float) else f"{n}{v}" for n, v in changed.items())
            if offset and self._add_offset_set("shape_" + label, module, seed):
                return
            if offset:
                # Tried once: the reference's exactness, not the sizes, is what usually fails.
                offset = False
                self.skip("shape offset", f"the problem's own values ({self.skipped_sets.pop().reason})")
            if self.try_add("shape_" + label, "shape", module, seed):
                return
        if not attempts:
            self.skip("shape", "no module-level size constant to vary")

    def _add_offset_set(self, name: str, module, seed: int) -> bool:
        """The shape set with the common offset, or with half of it where the fp32 reference is off
        its fp64 run at the whole (PyTorch's LayerNorm near 120 deviations) or cannot decide its
        steps there; the last reason a try was left out stays in ``skipped`` when neither is added."""
        for share, offset in zip((1.0, 0.5), self.offsets):
            if self.try_add(name, "shape", module, seed, lambda inputs: transform_tensors(inputs, offset),
                            exact=True, finite=self.base_finite, decided=True):
                self.sets[-1]["offset"] = share
                return True
            if share == 1.0 and len(self.offsets) > 1:
                self.skipped_sets.pop()  # the half offset decides
        return False

    def _wide_cap(self, base_numel: int) -> int:
        """Elements the wide set may hold: a multiple of the cap, or of the problem where uncapped
        (on CUDA also bounded by the free memory: inputs, outputs and the candidate's copies)."""
        import torch

        multiple = WIDE_CAP_MULTIPLE["cpu" if self.device == "cpu" else "cuda"]
        cap = multiple * (self.cap if self.cap > 0 else base_numel)
        if self.device != "cpu":
            free, _total = torch.cuda.mem_get_info()
            cap = min(cap, free // (4 * 8))
        return cap

    def _wide_candidates(self) -> list[dict[str, int]]:
        """Sizes above the problem's own: every non-batch constant grown (batch halved to fit),
        then each of the largest grown alone (the others shrunk to fit)."""
        growable = sorted((n for n, v in self.original_values.items() if v >= 4 and not is_batch_name(n)),
                          key=lambda n: -self.original_values[n])
        if not growable:
            return []
        grown = {n: grown_size(self.original_values[n]) for n in growable}
        attempts = [{**self.original_values, **grown}]
        attempts += [{**self.original_values, n: grown[n]} for n in growable[:3]]
        return attempts

    def _fit(self, values: dict[str, int], fixed: set[str], cap: int) -> dict[str, int] | None:
        for _ in range(200):
            try:
                numel = meta_numel(rewrite_constants(self.original_source, values))
            except Exception:  # noqa: BLE001 - a size combination the problem rejects
                return None
            if numel <= cap:
                return values
            batch = {n: v for n, v in values.items() if is_batch_name(n) and v > 1 and n not in fixed}
            if batch:
                name = max(batch, key=batch.get)
                values = {**values, name: max(1, values[name] // 2)}
                continue
            free = {n: v for n, v in values.items() if n not in fixed}
            smaller = shrink_step(free)
            if smaller is None:
                return None
            values = {**values, **smaller}
        return None

    def _add_wide_set(self, seed: int) -> None:
        base_numel = next(s["numel"] for s in self.sets if s["kind"] == "base")
        cap = self._wide_cap(base_numel)
        for attempt in self._wide_candidates():
            grown = {n for n, v in attempt.items() if v > self.original_values[n]}
            values = self._fit(attempt, grown, cap)
            if values is None:
                continue
            try:
                module = self.module_at(values)
            except Exception as exc:  # noqa: BLE001
                self.skip(f"wide {values}", f"problem failed to load ({type(exc).__name__})")
                continue
            if self.try_add("wide_" + "_".join(f"{n}={values[n]}" for n in sorted(grown)), "wide", module, seed):
                self._mark_above_cap(values)
                return
        for values, name in self._long_candidates(cap):
            if self.try_add(f"long_{name}={values[name]}", "wide", self.module_at(values), seed):
                self._mark_above_cap(values)
                return
        if self.cap > 0 and self.values != self.original_values:
            # Nothing wider than the problem fits: at least more elements than the cap, along the
            # same halving path that shrank the base.
            values, _notes = shrink_to_cap(self.original_source, cap)
            if values != self.values and self.try_add("large", "wide", self.module_at(values), seed):
                self._mark_above_cap(values)
                return
        self.skip("wide", "no size above the problem's own fits")

    def _long_candidates(self, cap: int):
        """Nothing wider than the problem fits: one non-batch size as long as the wide set's
        elements allow (odd, at most the problem's own), batch sizes at 2, the other constants at
        the base's. Shrinking every constant by the same halving keeps each row shorter than the
        blocks kernels hard-code (a softmax over one block of 1024 columns passed every set)."""
        growable = sorted((n for n, v in self.original_values.items() if v >= 4 and not is_batch_name(n)),
                          key=lambda n: -self.original_values[n])
        batch = {n: min(v, 2) for n, v in self.values.items() if is_batch_name(n)}
        for name in growable[:3]:
            size = self.original_values[name]
            while size > 2 * self.values[name]:
                values = {**self.values, **batch, name: min(size | 1, self.original_values[name])}
                try:
                    fits = meta_numel(rewrite_constants(self.original_source, values)) <= cap
                except Exception:  # noqa: BLE001 - a size combination the problem rejects
                    break
                if fits:
                    yield values, name
                    break
                size //= 2

    def problem_numel(self) -> int:
        """The elements of the problem's own inputs (0 where they cannot be measured)."""
        try:
            return meta_input_numel(self.original_source)
        except Exception:  # noqa: BLE001 - a problem whose inputs need a real device
            return 0

    def _mark_above_cap(self, values: dict[str, int]) -> None:
        self.sets[-1]["above_cap"] = self.cap > 0 and meta_numel(
            rewrite_constants(self.original_source, values)) > self.cap
