"""Kernels the CPU interpreter runs and Triton's GPU compiler refuses, and autotune configs the
CPU verifier never ran.

On CPU a ``@triton.jit`` function is executed as Python (``TRITON_INTERPRET=1``): ``break``, a list
comprehension over ``range``, ``abs(x)`` or ``libdevice.fast_tanhf`` run there, and Triton's code
generator refuses them when it compiles for a GPU. The static check refuses them
(``interpreter_only``, ``static_check/kernel_language.py``); each refused construct is also
compiled here with the installed Triton, which must refuse it too, and each accepted one must
compile. A multi-config ``@triton.autotune`` runs one config per input set in turn, on CPU and on
CUDA (``interpreter_compat.AutotuneRotation``), so a kernel right for its first config only is
wrong on another set.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import candidate_catalog as catalog
from extensions.verify.static import triton_api
from extensions.verify.static.static_check import static_check

FLAG = "interpreter_only"

PREFIX = """\
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
"""
SUFFIX = "    tl.store(y_ptr + offs, v, mask=mask)\n"


def kernel_source(body: str, decorator: str = "@triton.jit", params: str = "x_ptr, y_ptr, n, BLOCK: tl.constexpr",
                  prelude: str = "") -> str:
    """A module holding one kernel ``k`` whose body is ``body`` (indented by 4) between a load and
    a store."""
    body = textwrap.indent(textwrap.dedent(body).strip("\n") + "\n", "    ") if body.strip() else ""
    return f"""\
import torch
import torch.nn as nn
import triton
import triton.language as tl
{prelude}

{decorator}
def k({params}):
{PREFIX}{body}{SUFFIX}"""


def candidate(body: str, **kwargs) -> str:
    return kernel_source(body, **kwargs) + """

class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        k[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""


# Kernel bodies Triton's compiler refuses (3.6 and the installed one), each run fine by the interpreter.
REFUSED = {
    "break": """
        for i in range(n):
            if i > 2:
                break
            v = v + 1.0
    """,
    "continue": """
        for i in range(n):
            if i == 1:
                continue
            v = v + 1.0
    """,
    "break_in_static_range": """
        for i in tl.static_range(4):
            if i == 2:
                break
            v = v + 1.0
    """,
    "while_else": """
        i = 0
        while i < n:
            i += 1
        else:
            v = v + 1.0
    """,
    "for_else": """
        for i in range(n):
            v = v + 1.0
        else:
            v = v * 2.0
    """,
    "list_comprehension_over_range": """
        w = [v * i for i in range(2)]
        v = w[1]
    """,
    "list_comprehension_over_static_range": """
        w = [v * i for i in tl.static_range(2)]
        v = w[1]
    """,
    "comprehension_with_two_fors": """
        t = (1, 2)
        w = [a * b for a in t for b in t]
        v = v + w[3]
    """,
    "dict_display": """
        d = {"s": 2.0}
        v = v * d["s"]
    """,
    "set_comprehension": """
        s = {i for i in range(2)}
        v = v + len(s)
    """,
    "generator_expression": """
        v = v + sum(i for i in range(3))
    """,
    "lambda": """
        f = lambda a: a * 2.0
        v = f(v)
    """,
    "try": """
        try:
            v = v * 2.0
        except Exception:
            v = v
    """,
    "raise_on_a_runtime_value": """
        if n < 0:
            raise ValueError("negative n")
    """,
    "nested_def": """
        def twice(a):
            return a * 2.0
        v = twice(v)
    """,
    "del": """
        w = v
        del w
    """,
    "global": """
        global SCALE
        v = v * 2.0
    """,
    "for_over_a_tuple": """
        for s in (1.0, 2.0):
            v = v * s
    """,
    "for_over_enumerate": """
        for i, s in enumerate((1.0, 2.0)):
            v = v * s
    """,
    "in_operator": """
        if BLOCK in (16, 32):
            v = v * 2.0
    """,
    "matmul_operator": """
        m = tl.reshape(v, (4, BLOCK // 4))
        v = tl.reshape(m @ tl.trans(m), (BLOCK,))
    """,
    "item_assignment": """
        acc = [v, v]
        acc[0] = v * 2.0
        v = acc[0]
    """,
    "attribute_assignment": """
        v.scale = 2.0
    """,
    "starred_tuple": """
        t = (1.0, 2.0)
        u = (*t, 3.0)
        v = v * u[2]
    """,
    "builtin_abs": """
        v = abs(v)
    """,
    "builtin_round": """
        v = v * round(2.4)
    """,
    "builtin_bool": """
        if bool(BLOCK > 4):
            v = v * 2.0
    """,
    "libdevice_fast_tanhf": """
        v = tl.extra.libdevice.fast_tanhf(v)
    """,
}

# Kernel bodies next to the rules that compile: they must pass the whole static check.
ACCEPTED = {
    "range_loop": """
        for i in range(0, n, 4):
            v = v + 1.0
    """,
    "tl_range_loop": """
        for i in tl.range(0, n, 1, num_stages=2):
            v = v + 1.0
    """,
    "static_range_loop": """
        for i in tl.static_range(4):
            v = v + i
    """,
    "while_loop": """
        i = 0
        while i < n:
            v = v + 1.0
            i += 1
    """,
    "tuple_comprehension": """
        t = (1.0, 2.0)
        w = [v * s for s in t]
        v = w[0] + w[1]
    """,
    "list_display": """
        w = [v, v * 2.0]
        v = w[1]
    """,
    "compiler_builtins": """
        v = v * min(BLOCK, 4) + max(1, 2) + float(1) + int(2.0) + len((1, 2))
    """,
    "raise_under_constexpr_branch": """
        if BLOCK > 4096:
            raise ValueError("BLOCK is too large")
    """,
    "static_assert_with_fstring": """
        tl.static_assert(BLOCK > 0, f"BLOCK={BLOCK}")
    """,
    "conditional_expression": """
        v = v if BLOCK > 4 else v * 2.0
    """,
    "libdevice_functions": """
        v = tl.extra.libdevice.tanh(v) + tl.extra.cuda.libdevice.erf(v) + tl.math.exp(v)
    """,
    "unreachable_after_return": """
        tl.store(y_ptr + offs, v, mask=mask)
        return
        v = abs(v)
    """,
}


def _flags_and_errors(code: str) -> tuple[list[str], list[str]]:
    report = static_check(code)
    return report.flags, report.errors


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_construct_the_compiler_refuses_is_refused(name):
    flags, errors = _flags_and_errors(candidate(REFUSED[name]))
    assert FLAG in flags, (name, flags, errors)
    assert any("Triton's compiler refuses" in e or "CUDA's libdevice" in e for e in errors), errors


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_construct_the_compiler_accepts_passes(name):
    report = static_check(candidate(ACCEPTED[name]))
    assert report.ok, (name, report.errors)


def test_message_names_the_construct_and_line():
    code = candidate(REFUSED["break"])
    line = code.splitlines().index("            break") + 1
    errors = static_check(code).errors
    assert f"line {line}: Triton's compiler refuses `break` in a @triton.jit function (k)" in errors[0], errors


JIT_SPELLINGS = {
    "decorator_call": dict(decorator="@triton.jit(do_not_specialize=['n'])"),
    "jit_imported_by_name": dict(decorator="@jit", prelude="from triton import jit"),
    "jit_alias": dict(decorator="@compile_kernel", prelude="compile_kernel = triton.jit"),
    "under_autotune": dict(decorator="@triton.autotune(configs=[triton.Config({'S': 1})], key=['n'])\n@triton.jit",
                           params="x_ptr, y_ptr, n, BLOCK: tl.constexpr, S: tl.constexpr"),
    "under_heuristics": dict(decorator="@triton.heuristics({'S': lambda args: 1})\n@triton.jit",
                             params="x_ptr, y_ptr, n, BLOCK: tl.constexpr, S: tl.constexpr"),
}


@pytest.mark.parametrize("spelling", sorted(JIT_SPELLINGS))
def test_every_spelling_of_jit_is_judged(spelling):
    flags, errors = _flags_and_errors(candidate(REFUSED["break"], **JIT_SPELLINGS[spelling]))
    assert FLAG in flags, (spelling, errors)


def test_jit_called_on_a_function_and_jit_helpers_are_judged():
    helper = kernel_source("").replace("@triton.jit\ndef k(", "def plain(") + "\nk = triton.jit(plain)\n"
    helper = helper.replace("    v = tl.load", "    for s in (1.0,):\n        n = n\n    v = tl.load")
    flags, errors = _flags_and_errors(helper)
    assert FLAG in flags, errors
    jit_helper = kernel_source("v = scale(v)", prelude="\n@triton.jit\ndef scale(a):\n    return abs(a)\n")
    flags, errors = _flags_and_errors(jit_helper)
    assert FLAG in flags and any("(scale)" in e for e in errors), errors


def test_annotations_and_defaults_are_judged_python_elsewhere_is_not():
    flags, errors = _flags_and_errors(candidate("", params="x_ptr, y_ptr, n, BLOCK: tl.constexpr, FLAG: bool = True"))
    assert FLAG in flags and any("`bool`" in e for e in errors), errors
    # Host code may use any Python the allow-list admits: the rule holds inside kernels only.
    host = candidate("").replace("        y = torch.empty_like(x)\n", """\
        y = torch.empty_like(x)
        sizes = [d for d in x.shape if d > 1]
        for d in sizes:
            if d < 0:
                break
        flag: bool = abs(len(sizes)) in (0, 1, 2, 3)
""")
    report = static_check(host)
    assert report.ok, report.errors


@pytest.mark.parametrize("spelling", [
    "from triton.language.extra import libdevice\n", "from triton.language.extra.cuda import libdevice\n",
    "import triton.language.extra.libdevice as libdevice\n",
])
def test_libdevice_name_cuda_lacks_is_refused_however_reached(spelling):
    flags, errors = _flags_and_errors(candidate("v = libdevice.fast_tanhf(v)", prelude=spelling))
    assert FLAG in flags and any("libdevice.fast_tanhf is not a function of CUDA's libdevice" in e
                                 for e in errors), errors
    flags, _ = _flags_and_errors(candidate("v = fast_tanhf(v)",
                                           prelude="from triton.language.extra.libdevice import fast_tanhf\n"))
    assert FLAG in flags
    report = static_check(candidate("v = libdevice.tanh(v) + libdevice.fast_expf(v)", prelude=spelling))
    assert report.ok, report.errors


def test_fallback_alias_to_tl_math_still_passes():
    prelude = ("try:\n    from triton.language.extra import libdevice\n"
               "except ImportError:\n    libdevice = tl.math\n")
    report = static_check(candidate("v = libdevice.erf(v) + libdevice.exp(v)", prelude=prelude))
    assert report.ok, report.errors


def test_cuda_libdevice_list_is_what_the_installed_triton_defines():
    """CUDA_LIBDEVICE_API is the function set of triton.language.extra.cuda.libdevice (3.6 and the
    installed one define the same); every other math name the allow-list admits is tl.math's."""
    cuda = pytest.importorskip("triton.language.extra.cuda.libdevice")
    import triton.language as tl

    defined = {name for name, value in vars(cuda).items()
               if callable(value) and getattr(value, "__module__", None) == cuda.__name__}
    assert triton_api.CUDA_LIBDEVICE_API == defined
    assert triton_api.TRITON_MATH_API - triton_api.CUDA_LIBDEVICE_API <= set(vars(tl.math))
    assert "fast_tanhf" not in triton_api.TRITON_MATH_API


# -- the installed Triton agrees -------------------------------------------------------------------

def _write_kernels(path: Path, bodies: dict[str, str]) -> None:
    """A module with one kernel per body, named by its key."""
    parts = []
    for name, body in bodies.items():
        source = kernel_source(body)
        parts.append(source[source.index("@triton.jit"):].replace("def k(", f"def {name}("))
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + "\n\n".join(parts))


# Compiles every kernel of a module for an sm_90 GPU (no GPU needed for the front end) and prints,
# per kernel, the front end's error or "compiled" (a later stage failing here, ptxas say, is past
# the front end). Run in its own process: the tests' interpreter mode would hand Triton the
# interpreter's kernels.
_COMPILE_EACH = """
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, CompilationError
spec = importlib.util.spec_from_file_location("kernels", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
verdicts = {}
for name in sys.argv[2:]:
    src = ASTSource(fn=getattr(module, name), constexprs={"BLOCK": 16},
                    signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"})
    try:
        triton.compile(src, target=GPUTarget("cuda", 90, 32))
        verdicts[name] = "compiled"
    except CompilationError as exc:
        verdicts[name] = str(exc).strip().splitlines()[-1]
    except Exception:  # noqa: BLE001 - past the front end
        verdicts[name] = "compiled"
print(json.dumps(verdicts))
"""


def test_installed_triton_refuses_what_the_rule_refuses_and_compiles_the_rest(tmp_path):
    """Ties the rule to the installed compiler: if a Triton release learns ``break``, this fails
    and the rule must follow (the GPU image's Triton 3.6 refuses all of ``REFUSED`` as well)."""
    pytest.importorskip("triton.backends.nvidia")
    import json

    from conftest import PROJECT_ROOT

    bodies = {f"r_{name}": body for name, body in REFUSED.items()}
    bodies.update({f"a_{name}": body for name, body in ACCEPTED.items()})
    path = tmp_path / "gap_kernels.py"
    _write_kernels(path, bodies)
    env = {"PATH": "/usr/bin:/bin", "TRITON_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _COMPILE_EACH, str(path), *bodies], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    compiled = [name for name in REFUSED if verdicts[f"r_{name}"] == "compiled"]
    assert not compiled, f"the installed Triton compiles what the rule refuses: {compiled}"
    failed = {name: verdicts[f"a_{name}"] for name in ACCEPTED if verdicts[f"a_{name}"] != "compiled"}
    assert not failed, f"the installed Triton refuses what the rule lets through: {failed}"


# -- fixtures --------------------------------------------------------------------------------------

def test_interpreter_only_fixtures_are_refused_statically():
    cheats = [c for c in catalog.load_folder("cheats", require_expectation=True) if c.name.startswith("interpreter_only")]
    assert len(cheats) >= 4
    for cheat in cheats:
        report = static_check(cheat.text)
        assert FLAG in report.flags, (cheat.name, report.errors)
    solution = catalog.parse_candidate(catalog.CANDIDATES_DIR / "kernelbench" / "l1_047_sum_unrolled_loops.py", False)
    assert static_check(solution.text).ok


def _passes_in_the_interpreter(script: str) -> None:
    """Run ``script`` in a fresh interpreter-mode Python; it prints ``ok`` when its asserts hold."""
    from conftest import PROJECT_ROOT

    done = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


# -- autotune on CPU -------------------------------------------------------------------------------

def test_autotune_rotation_runs_every_config_in_turn():
    """In the worker's interpreter each input set runs one config of every autotuned kernel, in
    turn from the offset, among the configs ``prune_configs_by`` keeps; within a set the choice
    holds for every launch."""
    script = textwrap.dedent("""
        import torch, triton, triton.language as tl
        from extensions.verify.sandboxed import interpreter_compat
        interpreter = interpreter_compat.install()
        configs = [triton.Config({'BLOCK': b}) for b in (32, 64, 128)]

        @triton.autotune(configs=configs, key=['n'])
        @triton.jit
        def which(y, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + o, tl.zeros([BLOCK], tl.int32) + BLOCK, mask=o < n)

        def keep_two(configs, named_args, **kwargs):
            return [c for c in configs if c.kwargs['BLOCK'] != 64]

        @triton.autotune(configs=configs, key=['n'], prune_configs_by={'early_config_prune': keep_two})
        @triton.jit
        def pruned(y, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + o, tl.zeros([BLOCK], tl.int32) + BLOCK, mask=o < n)

        def launch(kernel):
            y = torch.zeros(300, dtype=torch.int32)
            kernel[lambda meta: (triton.cdiv(300, meta['BLOCK']),)](y, 300)
            first = int(y[0])
            assert (y == first).all(), y  # every program of the launch ran the same config
            assert kernel.best_config.kwargs['BLOCK'] == first
            return first

        seen, kept = [], []
        for index in range(6):
            interpreter.start_set(index, shuffled=False)
            a = launch(which)
            assert launch(which) == a  # the same set keeps its config
            seen.append(a)
            kept.append(launch(pruned))
        offset = interpreter.autotune.offset
        assert seen == [(32, 64, 128)[(offset + i) % 3] for i in range(6)], (offset, seen)
        assert kept == [(32, 128)[(offset + i) % 2] for i in range(6)], (offset, kept)
        print("ok")
    """)
    _passes_in_the_interpreter(script)


def test_gpu_rotation_benchmarks_and_makes_the_sets_config_win():
    """On CUDA, while the rotation lasts, the autotuner's benchmark runs the set's config alone and
    takes it (the next one that runs where this GPU cannot run it, as for a user), and no other
    config writes the output; after ``finish`` the autotuner chooses by timing again. The rotation's part needs no GPU: it runs in
    the interpreter here."""
    script = textwrap.dedent("""
        import torch, triton, triton.language as tl
        from triton.runtime.errors import OutOfResources
        from extensions.verify.sandboxed import interpreter_compat
        rotation = interpreter_compat.rotate_autotune_on_cuda()

        ran = []

        def too_big(nargs):
            raise OutOfResources(1 << 20, 1 << 16, "shared memory")

        configs = [triton.Config({'BLOCK': 32}, pre_hook=lambda nargs: ran.append(32)),
                   triton.Config({'BLOCK': 64}, pre_hook=lambda nargs: ran.append(64)),
                   triton.Config({'BLOCK': 128}, pre_hook=too_big)]

        @triton.autotune(configs=configs, key=['n'])
        @triton.jit
        def which(y, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + o, tl.zeros([BLOCK], tl.int32) + BLOCK, mask=o < n)

        def launch():
            y = torch.zeros(300, dtype=torch.int32)
            which[lambda meta: (triton.cdiv(300, meta['BLOCK']),)](y, 300)
            assert (y == int(y[0])).all(), y
            return int(y[0])

        seen = []
        for index in range(6):
            rotation.start_set(index)
            ran.clear()
            seen.append(launch())
            assert launch() == seen[-1]  # the same set keeps its config
            # no other config ran: a benchmark run of one would have written the output
            assert set(ran) == {seen[-1]}, (ran, seen[-1])
        wanted = [(32, 64, 128)[(rotation.offset + i) % 3] for i in range(6)]
        # where the set's config cannot run on this GPU, the first one that can takes its place
        assert seen == [32 if w == 128 else w for w in wanted], (rotation.offset, seen)
        assert set(seen) == {32, 64}
        rotation.finish()
        assert not rotation.rotating and not which.cache  # timing chooses by benchmark again
        print("ok")
    """)
    _passes_in_the_interpreter(script)


def test_verifier_runs_every_autotune_config(kernelbench_jsonl, verify_isolation, verify_device):
    """A kernel right for its first config only is rejected, on CPU and on CUDA (where the GPU's
    fastest config may be the one it is right for); a correct multi-config kernel passes whichever
    config each set runs."""
    from extensions.config import VerifierConfig
    from extensions.verify import VerifyRequest, verify_batch

    files = [catalog.parse_candidate(catalog.CANDIDATES_DIR / "wrong" / "autotune_right_for_first_config_only.py", True),
             catalog.parse_candidate(catalog.CANDIDATES_DIR / "kernelbench" / "rt_autotune_relu.py", False)]
    problems = catalog.load_problems(kernelbench_jsonl, {f.problem_key for f in files})
    requests = [VerifyRequest(problems[f.problem_key]["code"], f.text, label=f.name) for f in files]
    wrong, right = verify_batch(requests, VerifierConfig(isolation=verify_isolation), device=verify_device,
                                progress=False)
    assert not wrong.correct and wrong.error_category == "mismatch", (wrong.stage, wrong.error)
    assert right.correct and right.stage == "full", (right.stage, right.error)
    assert len(right.details.get("sets_run", [])) >= 3  # the 2-config kernel ran both configs


# -- what only a GPU can judge ---------------------------------------------------------------------

RELU_CANDIDATE = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    y = {body}
    tl.store(y_ptr + offsets, y, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 256),)](x, y, n, BLOCK=256)
        return y
"""


def test_inline_ptx_on_cpu_says_a_gpu_must_judge_it(kernelbench_jsonl, verify_isolation, verify_device):
    """The interpreter cannot run ``tl.inline_asm_elementwise`` (PTX): on CPU such a kernel fails,
    and the result carries ``needs_gpu`` so that the failure is not read as the kernel's; a kernel
    that fails on its own does not."""
    if verify_device != "cpu":
        pytest.skip("a GPU runs the PTX")
    from extensions.config import VerifierConfig
    from extensions.verify import VerifyRequest, verify_batch

    ptx = ('tl.inline_asm_elementwise("max.f32 $0, $1, 0f00000000;", "=r,r", [x], dtype=tl.float32, '
           'is_pure=True, pack=1)')
    relu = catalog.load_problems(kernelbench_jsonl, {(1, 19)})[(1, 19)]["code"]  # 19_ReLU
    requests = [VerifyRequest(relu, RELU_CANDIDATE.format(body=ptx), label="ptx"),
                VerifyRequest(relu, RELU_CANDIDATE.format(body="x + 1.0"), label="wrong")]
    ptx_result, wrong = verify_batch(requests, VerifierConfig(isolation=verify_isolation), device="cpu",
                                     progress=False)
    assert not ptx_result.correct and "needs_gpu" in ptx_result.flags, (ptx_result.stage, ptx_result.error)
    assert "interpreter refused" in ptx_result.details["needs_gpu"]
    assert not wrong.correct and "needs_gpu" not in wrong.flags, (wrong.stage, wrong.flags)


# -- the builder's signature across Triton releases --------------------------------------------------

class _Builder36:
    """The interpreter builder's load and store as Triton 3.6 spells them (two policy arguments)."""

    def __init__(self):
        self.calls = []

    def create_masked_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
        self.calls.append(("load", cache_modifier, eviction_policy, is_volatile))
        return "loaded"

    def create_masked_store(self, ptrs, value, mask, cache_modifier, eviction_policy):
        self.calls.append(("store", cache_modifier, eviction_policy))


class _Builder39(_Builder36):
    """... and as Triton 3.9 spells them (one)."""

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        self.calls.append(("load", cache_policy, is_volatile))
        return "loaded"

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        self.calls.append(("store", cache_policy))


@pytest.mark.parametrize("builder_class", [_Builder36, _Builder39], ids=["triton-3.6", "triton-3.9"])
def test_interpreter_wrappers_pass_every_policy_argument_through(builder_class, monkeypatch):
    """The worker's wrappers around the interpreter's masked load and store (the 0/1 mask reading
    and the concurrent memory view) hand the arguments after the mask on as they come, by position
    or by name: a wrapper spelled for one release raised TypeError in the other on every masked
    load, which rejected every correct kernel on CPU."""
    import inspect

    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    from extensions.verify.sandboxed import interpreter_compat

    names = list(inspect.signature(builder_class.create_masked_load).parameters)[4:]
    monkeypatch.setattr(interpreter, "InterpreterBuilder", builder_class)
    interpreter_compat.read_zero_one_masks_as_bool()
    policies = ("a", "b", False)[: 3 if builder_class is _Builder36 else 2]
    mask = interpreter.TensorHandle(np.ones(4, dtype=np.bool_), tl.int1)
    builder = builder_class()
    assert builder.create_masked_load("ptrs", mask, None, *policies) == "loaded"
    builder.create_masked_store("ptrs", "value", mask, *policies[:-1])

    view = interpreter_compat.ConcurrentMemoryView(interpreter_compat.ProgramOrder())
    view.install(builder)
    assert builder.create_masked_load("ptrs", mask, None, *policies) == "loaded"
    builder.create_masked_store("ptrs", "value", mask, *policies[:-1])
    # A tensor descriptor's load names them (and in 3.6 passes its mask as a bare array).
    assert builder.create_masked_load("ptrs", mask, None, **dict(zip(names, policies))) == "loaded"
    assert builder.create_masked_load("ptrs", np.ones(4, dtype=np.bool_), None, *policies) == "loaded"
    builder.create_masked_store("ptrs", "value", np.ones(4, dtype=np.bool_), *policies[:-1])
    assert builder.calls == [("load", *policies), ("store", *policies[:-1])] * 2 + [("load", *policies)] * 2 + [
        ("store", *policies[:-1])]


def test_a_scalar_argument_bounds_a_loop_where_numpy_refuses_one_element_arrays_as_ints():
    """Triton 3.6's interpreter turned a scalar argument into an int with ``int(array)``, which
    NumPy 2.4 refuses for a one-element array of one dimension: every kernel looping to a runtime
    bound (``range(0, n, BLOCK)``) raised on CPU. Here the interpreter is given that reading, with
    NumPy's strict rule, and the worker's compatibility layer must still run the loop."""
    script = textwrap.dedent("""
        import torch, triton, triton.language as tl
        from triton.runtime import interpreter
        from triton.runtime.errors import InterpreterError
        from extensions.verify.sandboxed import interpreter_compat

        def strict_int(data):
            if data.ndim:
                raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
            return int(data)

        original = interpreter._patch_lang_tensor

        def as_in_triton_3_6(tensor, scope):
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: strict_int(self.handle.data))

        interpreter._patch_lang_tensor = as_in_triton_3_6

        @triton.jit
        def total(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            acc = tl.zeros((BLOCK,), dtype=tl.float32)
            for start in range(0, n, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
            tl.store(y_ptr, tl.sum(acc))

        x, y = torch.arange(100, dtype=torch.float32), torch.zeros(1)
        try:
            total[(1,)](x, y, 100, BLOCK=32)
            raise AssertionError("the 3.6 reading ran the loop: the test no longer reproduces it")
        except InterpreterError:
            pass
        interpreter_compat.index_with_one_element_arrays()
        total[(1,)](x, y, 100, BLOCK=32)
        assert float(y) == 4950.0, float(y)
        print("ok")
    """)
    _passes_in_the_interpreter(script)


# -- bfloat16 in the interpreter -------------------------------------------------------------------

def test_bfloat16_converts_and_computes_on_values_as_a_gpu_does():
    """NumPy has no bfloat16, so the interpreter keeps bf16 as 16-bit patterns: it truncated fp32
    into bf16, cast integers and fp64 to the patterns' numeric values, and added, multiplied and
    ``tl.dot``-ed the patterns themselves. Each operation below must give what PyTorch gives (a GPU
    rounds to nearest even and computes on values), first shown to differ without the mend."""
    script = textwrap.dedent("""
        import torch, triton, triton.language as tl
        from triton.runtime.errors import InterpreterError
        from extensions.verify.sandboxed import interpreter_compat

        @triton.jit
        def convert(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

        @triton.jit
        def arithmetic(x_ptr, y_ptr, o_ptr, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            x, y = tl.load(x_ptr + offs), tl.load(y_ptr + offs)
            tl.store(o_ptr + offs, x + y)
            tl.store(o_ptr + BLOCK + offs, x * y)
            tl.store(o_ptr + 2 * BLOCK + offs, tl.maximum(x, y) - tl.abs(y))
            tl.store(o_ptr + 3 * BLOCK + offs, tl.where(x < y, -x, y))
            tl.store(o_ptr + 4 * BLOCK + offs, tl.full([BLOCK], 1.7, tl.bfloat16) * x)

        @triton.jit
        def matmul(a_ptr, b_ptr, o_ptr, N: tl.constexpr):
            r = tl.arange(0, N)
            a = tl.load(a_ptr + r[:, None] * N + r[None, :])
            b = tl.load(b_ptr + r[:, None] * N + r[None, :])
            tl.store(o_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))
            tl.store(o_ptr + N * N + r, tl.sum(a, 1).to(tl.float32))

        def run_all():
            torch.manual_seed(0)
            wrong = []
            for source in (torch.randn(256) * 50, (torch.randn(256) * 50).double(), torch.randint(-3000, 3000, (256,))):
                out = torch.empty(256, dtype=torch.bfloat16)
                convert[(1,)](source, out, 256, BLOCK=256)
                wrong.append(not torch.equal(out, source.to(torch.bfloat16)))
            x, y = torch.randn(2, 256, dtype=torch.bfloat16).unbind(0)
            out = torch.full((5, 256), float("nan"), dtype=torch.bfloat16)
            try:
                arithmetic[(1,)](x, y, out, BLOCK=256)
            except InterpreterError:  # Triton 3.6 has no bf16 constants in the interpreter
                pass
            expected = torch.stack([x + y, x * y, torch.maximum(x, y) - y.abs(), torch.where(x < y, -x, y),
                                    torch.tensor(1.7).to(torch.bfloat16) * x])
            wrong += [not torch.equal(out[i], expected[i]) for i in range(5)]
            a, b = torch.randn(2, 16, 16, dtype=torch.bfloat16).unbind(0)
            out = torch.empty(16 * 16 + 16)
            matmul[(1,)](a, b, out, N=16)
            wrong.append(not torch.allclose(out[:256].view(16, 16), a.float() @ b.float(), atol=1e-4))
            wrong.append(not torch.allclose(out[256:], a.float().sum(1), atol=0.05))
            return wrong

        before = run_all()
        assert all(before[:3]) and all(before[3:5]) and before[-2] and before[-1], before
        interpreter_compat.compute_bfloat16_as_values()
        after = run_all()
        assert not any(after), after
        print("ok")
    """)
    _passes_in_the_interpreter(script)


BF16_PROBLEM = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y, a, b):
        return torch.maximum(x, y) * 1.5 - y, a @ b


def get_inputs():
    return [torch.randn(16, 512, dtype=torch.bfloat16), torch.randn(16, 512, dtype=torch.bfloat16),
            torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
"""

BF16_CANDIDATE = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def elementwise(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, {elementwise}, mask=mask)


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        rk = k + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def forward(self, x, y, a, b):
        x, y, a, b = x.contiguous(), y.contiguous(), a.contiguous(), b.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        elementwise[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), dtype=a.dtype, device=a.device)
        matmul[(triton.cdiv(M, 16), triton.cdiv(N, 16))](a, b, c, M, N, K, BM=16, BN=16, BK=16)
        return out, c
"""


def test_bfloat16_kernels_are_judged_by_their_values(verify_isolation, verify_device):
    """A kernel computing in bf16 (each operation rounded to bf16, as the eager reference does) and
    a GEMM of bf16 operands with an fp32 accumulator are right; on CPU both were rejected (the
    interpreter added bit patterns), and a kernel off by a slip of the formula is wrong anywhere."""
    from extensions.config import VerifierConfig
    from extensions.verify import VerifyRequest, verify_batch

    right = BF16_CANDIDATE.format(elementwise="tl.maximum(x, y) * 1.5 - y")
    wrong = BF16_CANDIDATE.format(elementwise="tl.maximum(x, y) * 1.5 - x")
    results = verify_batch([VerifyRequest(BF16_PROBLEM, right, label="right"),
                            VerifyRequest(BF16_PROBLEM, wrong, label="wrong")],
                           VerifierConfig(isolation=verify_isolation, multi_input_num_tests=3),
                           device=verify_device, progress=False)
    assert results[0].correct and results[0].stage == ("full" if verify_device == "cpu" else "timing"), (
        results[0].stage, results[0].error)
    assert not results[1].correct and results[1].error_category == "mismatch", (results[1].stage, results[1].error)
