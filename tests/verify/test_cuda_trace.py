"""The chrome-trace reader the GPU timer's stream trace and the runtime audit share, on CPU: trace
files written here in the layout Kineto writes (a CUDA run's device events beside host events), a
real CPU profiler's trace, and the audit's kernel list read through it."""
from __future__ import annotations

import json

import pytest

from extensions.timing.cuda_trace import DEVICE_CATEGORIES, DeviceEvent, read_device_events
from extensions.verify.sandboxed.audit import RuntimeAudit

CALLING, SIDE = 7, 13

TRACE = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
    "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::fill_", "pid": 1, "tid": 1, "ts": 100.0, "dur": 9.0,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 102.0,
         "dur": 4.0, "args": {"correlation": 11, "stream": CALLING}},
        {"ph": "X", "cat": "kernel", "name": "relu_kernel", "pid": 0, "tid": CALLING, "ts": 150.5,
         "dur": 3.25, "args": {"stream": CALLING, "device": 0, "correlation": 12}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": CALLING, "ts": 110.0,
         "dur": 1.0, "args": {"stream": CALLING, "device": 0, "bytes": 4}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0, "tid": SIDE,
         "ts": 160, "dur": 2, "args": {"stream": SIDE, "device": 0, "bytes": 1024}},
        {"ph": "X", "cat": "kernel", "name": "hidden_kernel", "pid": 0, "tid": SIDE, "ts": 155.0,
         "dur": 40.0, "args": {"stream": SIDE, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "kernel_without_stream", "pid": 0, "tid": 0, "ts": 170.0},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "verifier::forward_start", "pid": 0,
         "tid": CALLING, "ts": 100.0, "dur": 80.0, "args": {"stream": CALLING}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 12, "pid": 1, "tid": 1, "ts": 102.0},
        {"ph": "X", "cat": "python_function", "name": "forward", "pid": 1, "tid": 1, "ts": 99.0, "dur": 90.0},
        {"ph": "i", "s": "t", "name": "Iteration Start: PyTorch Profiler", "pid": "Spans", "tid": "Spans",
         "ts": 90.0},
    ],
}


class WritesTrace:
    """Stands in for ``torch.profiler.profile``: its export writes ``content`` as the file."""

    def __init__(self, content):
        self.content = content
        self.paths = []

    def export_chrome_trace(self, path):
        self.paths.append(path)
        with open(path, "w") as fh:
            fh.write(self.content if isinstance(self.content, str) else json.dumps(self.content))


class FailsToExport(WritesTrace):
    def export_chrome_trace(self, path):
        super().export_chrome_trace(path)
        raise RuntimeError("Kineto could not save the trace")


def test_device_events_are_kernels_copies_and_fills_in_trace_order(tmp_path):
    path = tmp_path / "trace.json"
    profiler = WritesTrace(TRACE)
    events = read_device_events(profiler, str(path))
    assert profiler.paths == [str(path)]
    assert events == [
        DeviceEvent("kernel", "relu_kernel", CALLING, 150.5, 3.25),
        DeviceEvent("gpu_memset", "Memset (Device)", CALLING, 110.0, 1.0),
        DeviceEvent("gpu_memcpy", "Memcpy DtoD (Device -> Device)", SIDE, 160, 2),
        DeviceEvent("kernel", "hidden_kernel", SIDE, 155.0, 40.0),
        DeviceEvent("kernel", "kernel_without_stream", None, 170.0, None),
    ]
    assert {event.category for event in events} == set(DEVICE_CATEGORIES)
    assert [event.duration_us for event in events] == [3.25, 1.0, 2.0, 40.0, 0.0]
    assert not path.exists()


def test_an_event_missing_its_start_or_name_reads_as_zero_and_empty(tmp_path):
    profiler = WritesTrace({"traceEvents": [{"cat": "gpu_memset", "args": {"stream": SIDE}}, "not an event", 3]})
    assert read_device_events(profiler, str(tmp_path / "trace.json")) == [
        DeviceEvent("gpu_memset", "", SIDE, 0, None)]


@pytest.mark.parametrize("content", [{}, {"traceEvents": []}, [TRACE["traceEvents"]], "null"],
                         ids=["no_events_key", "no_events", "not_an_object", "null"])
def test_a_trace_without_device_events_reads_as_no_events(tmp_path, content):
    path = tmp_path / "trace.json"
    assert read_device_events(WritesTrace(content), str(path)) == []
    assert not path.exists()


def test_the_file_goes_when_export_or_parsing_fails(tmp_path):
    path = tmp_path / "trace.json"
    with pytest.raises(RuntimeError, match="could not save"):
        read_device_events(FailsToExport(TRACE), str(path))
    assert not path.exists()
    with pytest.raises(ValueError):
        read_device_events(WritesTrace('{"traceEvents": [{"cat": "kernel", '), str(path))
    assert not path.exists()


def test_a_profiler_that_writes_no_file_raises_file_not_found(tmp_path):
    class WritesNothing:
        def export_chrome_trace(self, path):
            pass

    with pytest.raises(FileNotFoundError):
        read_device_events(WritesNothing(), str(tmp_path / "trace.json"))
    assert not list(tmp_path.iterdir())


def test_a_real_cpu_profile_has_no_device_events(tmp_path):
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        torch.ones(8).add_(1)
    path = tmp_path / "cpu_trace.json"
    assert read_device_events(profiler, str(path)) == []
    assert not list(tmp_path.iterdir())


def test_the_audit_lists_the_kernels_in_time_order_with_their_streams(tmp_path):
    """Kernels only, sorted by start: the probe fill's stream (first) is the one the others are
    judged against."""
    audit = RuntimeAudit(False, "cuda", trace_dir=str(tmp_path))
    audit._read_cuda_trace(WritesTrace(TRACE), stream=None)
    assert audit.report.cuda_kernels == [
        ("relu_kernel", CALLING, 3.25), ("hidden_kernel", SIDE, 40.0), ("kernel_without_stream", None, 0.0)]
    assert "cuda_trace_error" not in audit.report.details
    assert not list(tmp_path.iterdir())


def test_the_audit_notes_a_trace_it_could_not_read(tmp_path):
    audit = RuntimeAudit(False, "cuda", trace_dir=str(tmp_path))
    audit._read_cuda_trace(FailsToExport(TRACE), stream=None)
    assert audit.report.cuda_kernels == []
    assert audit.report.details["cuda_trace_error"] == "RuntimeError: Kineto could not save the trace"
    assert not list(tmp_path.iterdir())
