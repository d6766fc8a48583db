"""Records and capture-time rules: every refusal and every capture problem, by its typed reason."""

from __future__ import annotations

import math

import pytest
from sim import bucket_plans, qwen_like, whisper_like

from models.layers.decode_attention import Backend
from resplan import (
    BucketPlan,
    CaptureError,
    CaptureProblem,
    KVPool,
    Refusal,
    ResidentStream,
    ResourceInfo,
    ResourceKind,
    RowLayout,
    Segment,
    StreamMode,
    build_planner,
    capture_streams,
    resident_refusal,
)

KV = ResourceKind.KV


# -- layouts --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "page_size,pages,max_seq_len",
    [(16, 2048, 262144), (16, 4097, 32768), (64, 100, 1000), (1, 9, 4)],
    ids=["pool-caps", "context-caps", "page64", "page1"],
)
def test_span_width_is_min_of_context_pages_and_usable_pool_pages(page_size, pages, max_seq_len):
    pool = KVPool("kv", page_size, pages, max_seq_len)
    assert pool.span_width == min(math.ceil(max_seq_len / page_size), pages - 1)


def test_a_qwen_like_row_is_narrow_cells_then_one_span():
    lay = RowLayout((KVPool("kv", 16, 2048, 262144),), "kv", recurrent=True, sampler=True)
    assert [c.name for c in lay.columns] == ["kv.len", "pos_offset", "recurrent_slot", "temperature", "top_p",
                                             "top_k", "seed", "min_position", *(f"stop_{i}" for i in range(11))]
    assert lay.span("kv").start == 19 and lay.width == 19 + 2047
    assert lay.row_bytes == 4 * lay.width
    assert "2047 kv pages (append)" in lay.describe(257)


def test_a_whisper_like_row_has_an_append_span_and_a_read_span():
    lay = whisper_like(page_size=4, max_seq_len=48, ctx_len=24)
    assert [(s.pool, s.mode) for s in lay.spans] == [("self", StreamMode.APPEND), ("cross", StreamMode.READ)]
    assert lay.span("cross").start == lay.span("self").start + 12 and lay.width == lay.narrow + 12 + 6


def test_pool_keys_must_be_distinct():
    with pytest.raises(ValueError, match="distinct"):
        RowLayout((KVPool("kv", 4, 8, 16), KVPool("kv", 4, 8, 16)), None, False, False)


def test_a_pool_needs_a_sink_page_and_one_more():
    with pytest.raises(ValueError, match="num_pages must be >= 2"):
        KVPool("kv", 4, 1, 16)


# -- bucket plans -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend,free", [(Backend.TORCH, True), (Backend.XQA, True), (Backend.TRITON, True),
                                          (Backend.FA2, False)], ids=["torch", "xqa", "triton", "fa2"])  # fmt: skip
def test_an_attention_is_host_plan_free_exactly_when_it_reads_the_tables(backend, free):
    assert backend.host_plan_free is free


def test_bucket_plans_are_hashable_and_key_by_static_fields():
    a = BucketPlan.build(4, {"kv": ResidentStream("decode", StreamMode.APPEND)}, True)
    b = BucketPlan.build(4, {"kv": ResidentStream("decode", StreamMode.APPEND)}, True)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1


def test_a_planner_refuses_buckets_whose_streams_disagree_with_the_layout():
    lay = whisper_like()
    wrong = [BucketPlan.build(2, {"self": ResidentStream("d", StreamMode.APPEND),
                                  "cross": ResidentStream("d", StreamMode.APPEND)}, True)]
    with pytest.raises(ValueError, match="pool 'cross' is append in its stream record but read in the layout"):
        build_planner(lay, wrong, 8)
    with pytest.raises(ValueError, match="no stream record for pools"):
        build_planner(lay, [BucketPlan.build(2, {"self": ResidentStream("d", StreamMode.APPEND)}, True)], 8)


def test_a_planner_is_sized_from_the_widest_bucket():
    st = build_planner(qwen_like(), bucket_plans(qwen_like(), (1, 8, 3)), 16)
    assert st.cfg.n_slots == 17 and [b.size for b in st.cfg.buckets] == [1, 3, 8]


# -- refusals -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "info,reason",
    [
        (ResourceInfo("kv", KV, has_table=False), Refusal.NO_TABLE),
        (ResourceInfo("kv", KV, shared_by_nodes=True), Refusal.SHARED_POOL),
        (ResourceInfo("kv", KV, read_across_nodes=True), Refusal.CROSS_NODE_READ),
        (ResourceInfo("kv", KV, sliding_window=4096), Refusal.SLIDING_WINDOW),
        (ResourceInfo("kv", KV, has_sink=False), Refusal.NO_SINK_PAGE),
        (ResourceInfo("xattn", KV, context_pool="kv", query_pool="kv"), Refusal.CONTEXT_IN_QUERY_POOL),
        (ResourceInfo("xattn", KV, context_pool="cross", query_pool="self"), None),
        (ResourceInfo("gdn", ResourceKind.RECURRENT), None),
    ],
    ids=["no-table", "shared", "cross-node", "sliding", "no-sink", "ctx-in-query-pool", "own-ctx-pool", "gdn"],
)
def test_resident_refusal(info, reason):
    assert resident_refusal(info) is reason


# -- capture problems ---------------------------------------------------------------------------------------------
RES = {
    "kv": ResourceInfo("kv", KV),
    "cross": ResourceInfo("cross", KV),
    "gdn": ResourceInfo("gdn", ResourceKind.RECURRENT),
    "pos": ResourceInfo("pos", ResourceKind.POSITIONS),
    "window": ResourceInfo("window", KV, sliding_window=128),
}


def test_a_well_formed_walk_gives_one_stream_record_per_resource():
    walk = {"kv": [Segment("decode", 1)], "cross": [Segment("ctx", 0)], "gdn": [Segment("decode", 1)],
            "pos": [Segment("decode", 1)]}
    out = capture_streams(walk, RES, positions_pool="kv")
    assert out["kv"] == ResidentStream("decode", StreamMode.APPEND)
    assert out["cross"] == ResidentStream("ctx", StreamMode.READ)


@pytest.mark.parametrize(
    "walk,positions_pool,problem",
    [
        ({"lora": [Segment("d", 1)]}, None, CaptureProblem.UNKNOWN_RESOURCE),
        ({"kv": [Segment("a", 1), Segment("b", 1)]}, None, CaptureProblem.TWO_LABELS),
        ({"kv": [Segment("d", 1), Segment("d", 0)]}, None, CaptureProblem.MIXED_SPANS),
        ({"kv": [Segment("d", 2)]}, None, CaptureProblem.MIXED_SPANS),
        ({"kv": [Segment("d", 1)], "pos": [Segment("d", 1)]}, "cross", CaptureProblem.POSITIONS_OFF_POOL),
        ({"cross": [Segment("d", 0)], "pos": [Segment("d", 1)]}, "cross", CaptureProblem.POSITIONS_OFF_POOL),
        ({"kv": [Segment("d", 1)], "pos": [Segment("other", 1)]}, "kv", CaptureProblem.POSITIONS_OFF_POOL),
        ({"gdn": [Segment("d", 0)]}, None, CaptureProblem.RECURRENT_ONLY_READ),
        ({"window": [Segment("d", 1)]}, None, CaptureProblem.REFUSED),
    ],
    ids=["unknown", "two-labels", "mixed-spans", "span-2", "pos-unnamed-pool", "pos-on-read-pool", "pos-label",
         "recurrent-read", "refused"],
)
def test_capture_problems(walk, positions_pool, problem):
    with pytest.raises(CaptureError) as err:
        capture_streams(walk, RES, positions_pool=positions_pool)
    assert err.value.problem is problem and problem.name in str(err.value)


def test_the_planner_boundary_checks_argument_types():
    from beartype.roar import BeartypeCallHintParamViolation

    with pytest.raises(BeartypeCallHintParamViolation):
        build_planner(qwen_like(), bucket_plans(qwen_like(), (1,)), "8")


def test_the_row_check_refuses_a_store_of_the_wrong_dtype():
    import numpy as np
    from jaxtyping import TypeCheckError

    from resplan import HostStreams, row_check

    lay = qwen_like()
    st = build_planner(lay, bucket_plans(lay, (1,)), 4)
    with pytest.raises(TypeCheckError):
        row_check(np.zeros((3, lay.width), np.int64), st, np.array([0]), HostStreams.zeros(lay, 4))
