"""Named reasons for dropping a row: every row read is either kept or counted under one of these."""
from __future__ import annotations

MALFORMED_JSON = "malformed_json"
UNDECODABLE_BYTES = "undecodable_bytes"
NOT_AN_OBJECT = "not_an_object"
MISSING_FIELD = "missing_field"  # reported as "missing_field:<name>"
EMPTY_FIELD = "empty_field"  # reported as "empty_field:<name>"
TASK_SYNTAX_ERROR = "task_syntax_error"
SOLUTION_SYNTAX_ERROR = "solution_syntax_error"
NO_ENTRY_POINT_CLASS = "no_entry_point_class"
NO_SOLUTION_CLASS = "no_solution_class"
NO_TASK_FUNCTIONS = "no_get_inputs_or_get_init_inputs"
NAME_CONFLICT = "name_conflict"  # the task already defines Model / the solution ModelNew otherwise
INIT_INPUTS_UNMAPPABLE = "init_inputs_unmappable"
SOLUTION_WITHOUT_TRITON_KERNEL = "solution_without_triton_kernel"
SOLUTION_CALLS_LIBRARY_KERNEL = "solution_calls_library_kernel"
NOT_CANONICALISABLE = "not_canonicalisable"  # reported as "not_canonicalisable:<rule's reason>"
VERIFY_FAILED = "verify_failed"  # reported as "verify_failed:<last stage passed>"
TASK_TOO_LONG = "task_too_long"
SOLUTION_TOO_LONG = "solution_too_long"
EXACT_DUPLICATE = "exact_duplicate"
NEAR_DUPLICATE = "near_duplicate"
CONTAMINATED = "overlaps_eval_problem"  # text: task Jaccard >= decontamination_threshold
SAME_COMPUTATION = "same_computation_as_eval_problem"  # traced operator graph (operator_graph.py)
LEVEL_NOT_SELECTED = "level_not_selected"
BAD_LEVEL = "bad_level"


class RowRejected(Exception):
    """A row that cannot be used; ``reason`` is one of the names above (optionally ``name:detail``)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
