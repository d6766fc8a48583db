"""resplan: resident decode planning. Re-exports only; each name is defined in the module named beside it."""

from resplan.buffers import StepBuffers
from resplan.capture import (
    CaptureError,
    CaptureProblem,
    Refusal,
    ResourceInfo,
    ResourceKind,
    Segment,
    capture_streams,
    resident_refusal,
)
from resplan.executor import Executor, KernelImpl
from resplan.graph import Graph, distinct_streams, run_on
from resplan.layout import (
    SAMPLER_CELLS,
    SINK_PAGE,
    SINK_SLOT,
    TRASH_ROW,
    Column,
    ColumnKind,
    KVPool,
    RowLayout,
    SamplerCell,
    Span,
    StreamMode,
    bits_float,
    float_bits,
)
from resplan.planner import commit, mark_stale, plan, release
from resplan.records import BucketPlan, FlushProgram, ResidentStream, Step
from resplan.rowcheck import Mismatch, row_check
from resplan.state import PlanError, PlannerConfig, PlannerState, build_planner
from resplan.streams import HostStreams, KVStreams

__all__ = [
    "SAMPLER_CELLS", "SINK_PAGE", "SINK_SLOT", "TRASH_ROW", "BucketPlan", "CaptureError", "CaptureProblem",
    "Column", "ColumnKind", "Executor", "FlushProgram", "Graph", "HostStreams", "KVPool", "KVStreams", "KernelImpl",
    "Mismatch", "PlanError", "PlannerConfig", "PlannerState", "Refusal", "ResidentStream", "ResourceInfo",
    "ResourceKind", "RowLayout", "SamplerCell", "Segment", "Span", "Step", "StepBuffers", "StreamMode", "bits_float",
    "build_planner", "capture_streams", "commit", "distinct_streams", "float_bits", "mark_stale", "plan", "run_on",
    "release", "resident_refusal", "row_check",
]
