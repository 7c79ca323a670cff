"""Find the candidate module (``class ModelNew`` with its Triton kernels) in a raw model response.

Nothing here executes code: every decision comes from text scanning and ``ast.parse``.

Rules, in order:

1. Clean the text: drop a BOM and zero-width spaces, turn Windows/Mac line endings into ``\\n``,
   turn non-breaking spaces into spaces.
2. Reasoning is never the answer. Closed ``<think>``/``<thinking>``/``<reasoning>`` spans are cut
   out; a lone closing tag (the opening one sat in the chat template) drops everything before it;
   a response that ends inside an unclosed reasoning span has no answer.
3. Fenced blocks (```` ``` ```` or ``~~~``, three or more, any language tag, any indentation) are
   the candidates. A block cut off by the end of the response is trimmed from the end until it
   parses. Each block is judged on its own; a complete block that does not parse gets stray prose
   lines (column 0) blanked if that makes it parse. Tabs mixed with spaces are expanded when the
   block only parses that way.
4. The answer is the **last complete block that parses and defines ``class ModelNew``**; an
   unterminated block is used only when no complete one qualifies. When that block uses names it
   does not define (kernels, helpers, imports) and earlier blocks define them, those earlier blocks
   are joined in front of it, in their order (only their imports when imports are all they
   supply). Later blocks (test harnesses, usage examples) are never joined.
5. Without a usable fenced block, the answer text itself is read as code: prose lines at column 0
   are blanked, a tail that breaks parsing after ``class ModelNew`` is cut, so what remains is the
   longest parseable span around ``ModelNew``.
6. A top-level ``if __name__ == "__main__":`` block is removed from the result: it never runs when
   the candidate is imported and often holds a test harness.

When no parseable module defines ``ModelNew`` but a fenced block mentions ``class ModelNew``, that
block is returned as is, so the static check can report the syntax error with its line.
"""
from __future__ import annotations

import ast
import builtins
import re
import textwrap
from dataclasses import dataclass, field
from typing import Optional

from .answer_cleanup import remove_harness_and_echo, tidy, try_parse

METHODS = ("fenced", "fenced_untagged", "unterminated_fence", "unfenced", "none")


@dataclass
class Extraction:
    code: Optional[str]  # the Python source to judge, or None
    method: str  # one of METHODS
    error: Optional[str]  # short reason when code is None
    candidates_seen: int  # how many code blocks were considered
    # What was done to get ``code``: blocks joined, lines trimmed or blanked, harness removed.
    notes: list[str] = field(default_factory=list)


_REASONING_TAGS = ("think", "thinking", "reasoning")
_CLOSED_REASONING = re.compile(
    r"<(?P<tag>" + "|".join(_REASONING_TAGS) + r")>.*?</(?P=tag)>", re.IGNORECASE | re.DOTALL
)
_CLOSE_TAG = re.compile(r"</(?:" + "|".join(_REASONING_TAGS) + r")>", re.IGNORECASE)
_OPEN_TAG = re.compile(r"<(?:" + "|".join(_REASONING_TAGS) + r")>", re.IGNORECASE)

_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
_MODELNEW_LINE = re.compile(r"^class[ \t]+ModelNew\b", re.MULTILINE)
_MODELNEW_ANYWHERE = re.compile(r"\bclass[ \t]+ModelNew\b")
_BUILTIN_NAMES = frozenset(dir(builtins)) | {"__name__", "__file__", "__doc__"}


@dataclass
class _Block:
    text: str
    tag: str  # first word of the info string, lower case; "" when untagged
    terminated: bool
    index: int


@dataclass
class _Parsed:
    code: str
    tree: ast.Module
    notes: list[str]


def extract_code(response: str) -> Extraction:
    """The candidate module in ``response`` (see the module docstring for the rules)."""
    if not isinstance(response, str):
        return Extraction(None, "none", f"response is {type(response).__name__}, not text", 0)
    text = _clean_text(response)
    if not text.strip():
        return Extraction(None, "none", "empty response", 0)
    answer, reasoning_note = _strip_reasoning(text)
    if answer is None:
        return Extraction(None, "none", "response ended inside reasoning; no answer", 0)
    if not answer.strip():
        return Extraction(None, "none", "no answer after the reasoning", 0)

    blocks = _fenced_blocks(answer)
    notes = [reasoning_note] if reasoning_note else []
    if blocks:
        result = _from_blocks(blocks)
        if result.code is not None:
            result.notes[:0] = notes
            return result
        # The code may sit outside the fences (fences used only for shell commands or output).
        fallback = _from_unfenced(_without_fenced_blocks(answer))
        if fallback.code is not None:
            fallback.candidates_seen += len(blocks)
            fallback.notes[:0] = notes
            return fallback
        result.notes[:0] = notes
        return result
    result = _from_unfenced(answer)
    result.notes[:0] = notes
    return result


def normalize_code(code: str) -> str:
    """Canonical form for de-duplication: same program, same string.

    Parses and unparses (comments, formatting and docstrings dropped); text that does not parse is
    whitespace-normalised instead (tabs expanded, trailing spaces and blank lines dropped, runs of
    inner whitespace collapsed).
    """
    text = _clean_text(code)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        lines = []
        for line in text.expandtabs(4).split("\n"):
            stripped = line.rstrip()
            if not stripped:
                continue
            indent = len(stripped) - len(stripped.lstrip(" "))
            lines.append(" " * indent + " ".join(stripped.split()))
        return "\n".join(lines)
    drop_docstrings(tree)
    return ast.unparse(tree)


# --- text cleaning and reasoning ---------------------------------------------------------------

def _clean_text(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    for invisible in ("\ufeff", "\u200b", "\u200c", "\u200d", "\u2060"):
        text = text.replace(invisible, "")
    return text.replace("\u00a0", " ")


def _strip_reasoning(text: str) -> tuple[Optional[str], Optional[str]]:
    """(answer, note); answer None when the response ends inside reasoning."""
    stripped = _CLOSED_REASONING.sub("", text)
    note = "reasoning removed" if stripped != text else None
    closes = list(_CLOSE_TAG.finditer(stripped))
    if closes:
        stripped = stripped[closes[-1].end():]
        note = "reasoning removed"
    opening = _OPEN_TAG.search(stripped)
    if opening:
        before = stripped[:opening.start()]
        if not before.strip():
            return None, note
        stripped = before
        note = "unclosed reasoning removed"
    return stripped, note


# --- fenced blocks -----------------------------------------------------------------------------

def _fenced_blocks(text: str) -> list[_Block]:
    blocks: list[_Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        opener = _FENCE_OPEN.match(lines[i])
        if not opener:
            i += 1
            continue
        fence = opener.group("fence")
        info = opener.group("info").strip()
        tag = info.split()[0].lower() if info else ""
        closer = re.compile(r"^[ \t]*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$")
        body: list[str] = []
        terminated = False
        i += 1
        while i < len(lines):
            line = lines[i]
            if closer.match(line):
                terminated = True
                i += 1
                break
            if line.rstrip().endswith(fence) and line.strip() != fence:
                # Closing fence glued to the last code line.
                body.append(line.rstrip()[: -len(fence)])
                terminated = True
                i += 1
                break
            body.append(line)
            i += 1
        blocks.append(_Block(textwrap.dedent("\n".join(body)), tag, terminated, len(blocks)))
    return blocks


def _without_fenced_blocks(text: str) -> str:
    """``text`` with fenced blocks and their fences blanked (line numbers kept)."""
    lines = text.split("\n")
    inside: Optional[str] = None
    out = []
    for line in lines:
        if inside is None:
            opener = _FENCE_OPEN.match(line)
            if opener:
                inside = opener.group("fence")
                out.append("")
                continue
            out.append(line)
        else:
            if re.match(r"^[ \t]*" + re.escape(inside[0]) + "{" + str(len(inside)) + r",}[ \t]*$", line):
                inside = None
            out.append("")
    return "\n".join(out)


def _from_blocks(blocks: list[_Block]) -> Extraction:
    parsed: list[Optional[_Parsed]] = [_parse_block(block) for block in blocks]
    with_modelnew = [
        i for i, p in enumerate(parsed) if p is not None and _defines_modelnew(p.tree)
    ]
    complete = [i for i in with_modelnew if blocks[i].terminated]
    chosen = complete[-1] if complete else (with_modelnew[-1] if with_modelnew else None)
    if chosen is None:
        mentioning = [b for b in blocks if _MODELNEW_ANYWHERE.search(b.text)]
        if mentioning:
            block = mentioning[-1]
            return Extraction(
                block.text.strip("\n") + "\n", _block_method(block), None, len(blocks),
                ["code block defining ModelNew does not parse; returned as written"],
            )
        return Extraction(
            None, "none", f"no code block defines ModelNew ({len(blocks)} blocks seen)", len(blocks)
        )
    block, chosen_parse = blocks[chosen], parsed[chosen]
    assert chosen_parse is not None
    code, notes = _join_with_earlier(chosen_parse, parsed[:chosen])
    code, cleanup_notes = remove_harness_and_echo(code)
    notes = chosen_parse.notes + notes + cleanup_notes
    if len(with_modelnew) > 1:
        notes.append(f"{len(with_modelnew)} blocks define ModelNew; used block {chosen + 1}")
    return Extraction(code, _block_method(block), None, len(blocks), notes)


def _block_method(block: _Block) -> str:
    if not block.terminated:
        return "unterminated_fence"
    return "fenced" if block.tag else "fenced_untagged"


def _parse_block(block: _Block) -> Optional[_Parsed]:
    text = block.text.strip("\n")
    if not text.strip():
        return None
    if not block.terminated:
        return _trim_truncated(text)
    parsed = _parse_with_tab_fix(text)
    if parsed is not None:
        return parsed
    return _blank_prose_lines(text, truncate_tail=False)


# --- parsing and repair ------------------------------------------------------------------------

def _parse_with_tab_fix(code: str) -> Optional[_Parsed]:
    tree, _ = try_parse(code)
    if tree is not None:
        return _Parsed(code + "\n", tree, [])
    if "\t" in code:
        for width in (8, 4):  # 8 is how Python itself reads a tab
            expanded = code.expandtabs(width)
            tree, _ = try_parse(expanded)
            if tree is not None:
                return _Parsed(expanded + "\n", tree, [f"tabs expanded to {width} spaces"])
    return None


def _trim_truncated(text: str) -> Optional[_Parsed]:
    """Cut a response that stopped mid-code back to the longest prefix that parses."""
    lines = text.split("\n")
    original = len(lines)
    while lines:
        parsed = _parse_with_tab_fix("\n".join(lines))
        if parsed is not None:
            if not _defines_modelnew(parsed.tree):
                return None
            dropped = original - len(lines)
            if dropped:
                parsed.notes.append(f"cut off: dropped the last {dropped} lines to parse")
            return parsed
        _, error = try_parse("\n".join(lines))
        lineno = getattr(error, "lineno", None) or len(lines)
        # The error line is where parsing broke (an unclosed bracket or string reports where it
        # opened); drop it and everything after, at least one line per round.
        keep = min(lineno - 1, len(lines) - 1)
        lines = lines[:max(keep, 0)]
        while lines and not lines[-1].strip():
            lines.pop()
    return None


def _blank_prose_lines(text: str, truncate_tail: bool) -> Optional[_Parsed]:
    """Blank prose lines at column 0 (and, if ``truncate_tail``, cut a broken tail after
    ``class ModelNew``) until the text parses. None when that does not work."""
    lines = text.split("\n")
    modelnew_rows = [i for i, line in enumerate(lines) if _MODELNEW_LINE.match(line)]
    if not modelnew_rows:
        return None
    blanked = 0
    cut = 0
    for _ in range(len(lines) + 2):
        code = "\n".join(lines)
        parsed = _parse_with_tab_fix(code)
        if parsed is not None:
            if not _defines_modelnew(parsed.tree):
                return None
            if blanked:
                parsed.notes.append(f"blanked {blanked} prose lines")
            if cut:
                parsed.notes.append(f"dropped {cut} trailing lines that did not parse")
            return parsed
        _, error = try_parse(code)
        lineno = getattr(error, "lineno", None)
        if lineno is None or lineno < 1:
            return None
        row = min(lineno, len(lines)) - 1
        line = lines[row]
        first_modelnew = modelnew_rows[0]
        if line.strip() and not line[0].isspace() and row not in modelnew_rows:
            lines[row] = ""
            blanked += 1
        elif truncate_tail and row > first_modelnew:
            cut += len(lines) - row
            lines = lines[:row]
            modelnew_rows = [r for r in modelnew_rows if r < row]
        else:
            return None
    return None


def _defines_modelnew(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in targets):
                return True
    return False


# --- unfenced responses ------------------------------------------------------------------------

def _from_unfenced(text: str) -> Extraction:
    if not _MODELNEW_LINE.search(text):
        return Extraction(None, "none", "no code defines ModelNew", 1)
    body = text.strip("\n")
    parsed = _parse_with_tab_fix(body) or _blank_prose_lines(body, truncate_tail=True)
    if parsed is None:
        return Extraction(None, "none", "no parseable code defines ModelNew", 1)
    code, notes = _blank_bare_names(parsed)
    code, cleanup_notes = remove_harness_and_echo(code)
    return Extraction(code, "unfenced", None, 1, notes + cleanup_notes)


def _blank_bare_names(parsed: _Parsed) -> tuple[str, list[str]]:
    """Blank top-level statements that are a lone word ("python", "Output"): prose, not code."""
    lines = parsed.code.split("\n")
    bare = [
        node for node in parsed.tree.body
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Name)
        and node.value.id not in _BUILTIN_NAMES
    ]
    for node in bare:
        for row in range(node.lineno - 1, (node.end_lineno or node.lineno)):
            lines[row] = ""
    code = tidy("\n".join(lines))
    notes = parsed.notes + ([f"blanked {len(bare)} lone-word lines"] if bare else [])
    return code, notes


# --- joining split answers and removing harnesses ----------------------------------------------

def _join_with_earlier(chosen: _Parsed, earlier: list[Optional[_Parsed]]) -> tuple[str, list[str]]:
    needed = _unbound_names(chosen.tree)
    if not needed:
        return tidy(chosen.code), []
    provided_so_far = _top_level_bindings(chosen.tree)[0] | _top_level_bindings(chosen.tree)[1]
    pieces: dict[int, str] = {}
    for index in range(len(earlier) - 1, -1, -1):
        block = earlier[index]
        if block is None or not needed:
            continue
        defined, imported = _top_level_bindings(block.tree)
        supplies_defs = needed & defined
        supplies_imports = needed & imported
        if not supplies_defs and not supplies_imports:
            continue
        if supplies_defs:
            pieces[index] = block.code
            provided = defined | imported
            needed |= _unbound_names(block.tree) - provided_so_far
        else:
            pieces[index] = "\n".join(
                ast.get_source_segment(block.code, node) or ""
                for node in block.tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
            )
            provided = imported
        provided_so_far |= provided
        needed -= provided
    if not pieces:
        return tidy(chosen.code), []
    joined = "\n\n".join([pieces[i].strip("\n") for i in sorted(pieces)] + [chosen.code.strip("\n")])
    tree, _ = try_parse(joined)
    if tree is None:
        return tidy(chosen.code), ["joining earlier blocks did not parse; used the block alone"]
    return tidy(joined), [f"joined {len(pieces)} earlier block(s) that define names it uses"]


def _top_level_bindings(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound by definitions and assignments, names bound by imports) at module level."""
    defined: set[str] = set()
    imported: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                imported.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defined.add(name.id)
    return defined, imported


def _unbound_names(tree: ast.Module) -> set[str]:
    """Names read somewhere in the module that nothing in it binds and that are not builtins."""
    used: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    return used - bound - _BUILTIN_NAMES


def drop_docstrings(tree: ast.AST) -> None:
    """Remove every module, class and function docstring from ``tree`` in place."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                body.pop(0)
                if not body and not isinstance(node, ast.Module):
                    body.append(ast.Pass())
