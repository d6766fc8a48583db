"""One test per planner rule; each fails if its rule is undone."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from sim import SimEngine, bucket_plans, qwen_like, whisper_like

from resplan import (
    HostStreams,
    KVPool,
    PlanError,
    RowLayout,
    Step,
    StreamMode,
    build_planner,
    commit,
    mark_stale,
    plan,
    release,
)


def engine(layout=None, buckets=(1, 2, 4), **kw) -> SimEngine:
    return SimEngine(layout or qwen_like(), buckets, **kw)


# -- sizes and the trash row ------------------------------------------------------------------------------------
def test_store_has_2b_plus_1_rows_and_row_0_is_never_handed_out():
    e = engine(buckets=(1, 2, 4))
    assert e.state.cfg.n_slots == 9 and e.ex.store.shape[0] == 9
    hs = [e.admit(5) for _ in range(4)]
    _, program = e.resident_step(hs)
    assert 0 not in program.run_slot.tolist()
    assert sorted(program.slot_row.tolist()) == sorted(e.state.slot_of[hs].tolist())
    assert not e.ex.store[0].any()


def test_padding_entries_of_a_slot_row_point_at_the_trash_row():
    e = engine(buckets=(4,))
    hs = [e.admit(3), e.admit(6)]
    _, program = e.resident_step(hs)
    assert program.slot_row.tolist()[2:] == [0, 0]


# -- steady steps -------------------------------------------------------------------------------------------------
def test_a_steady_step_with_no_crossing_and_the_same_slot_row_is_an_empty_program():
    e = engine(qwen_like(page_size=8))
    hs = [e.admit(2), e.admit(3)]
    e.resident_step(hs)
    _, program = e.resident_step(hs)  # lengths 3, 4: no page opens
    assert program.empty and program.h2d_copies == 0 and program.h2d_bytes == 0


def test_the_slot_row_is_uploaded_only_when_it_differs_from_the_last_one_of_its_bucket():
    e = engine(qwen_like(page_size=8), buckets=(2, 4))
    a, b = e.admit(2), e.admit(3)
    _, p1 = e.resident_step([a, b])
    _, p2 = e.resident_step([a, b])
    _, p3 = e.resident_step([b, a])
    assert p1.slot_row is not None and p2.slot_row is None and p3.slot_row is not None
    _, p4 = e.resident_step([b, a, e.admit(1)])  # another bucket: its own last slot row
    assert p4.slot_row is not None and p4.slot_row.size == 4


def test_a_row_whose_next_token_opens_a_page_stages_exactly_that_cell():
    e = engine(qwen_like(page_size=4))
    a, b = e.admit(3), e.admit(5)
    e.resident_step([a, b])  # a: L=3 -> 4, b: 5 -> 6
    _, program = e.resident_step([a, b])  # a stores 4 tokens: its 5th opens page 1
    assert program.crossings == 1 and program.h2d_copies == 1
    slot = e.state.slot(a)
    span = e.layout.span("kv")
    assert program.staged_idx.tolist() == [slot * e.layout.width + span.start + 1]
    assert program.staged_val.tolist() == [int(e.streams.kv["kv"].pages[a, 1])]


# -- whole rows ---------------------------------------------------------------------------------------------------
def test_a_new_row_is_written_whole_in_one_run_for_a_one_pool_layout():
    e = engine(qwen_like(page_size=4))
    a = e.admit(9)  # 9 stored + the step's token: 3 pages used
    _, program = e.resident_step([a])
    lay = e.layout
    assert program.rows_whole == 1 and program.new_rows == 1
    assert program.run_len.tolist() == [lay.narrow + 3] and program.run_col.tolist() == [0]
    assert program.run_cells[lay.narrow :].tolist() == e.streams.kv["kv"].pages[a, :3].tolist()
    assert program.run_cells[lay.len_col("kv")] == 9


def test_a_stale_row_keeps_its_slot_and_is_written_whole():
    e = engine()
    a = e.admit(5)
    e.resident_step([a])
    slot = e.state.slot(a)
    e.host_step([a], tokens=3)
    _, program = e.resident_step([a])
    assert e.state.slot(a) == slot and program.rows_whole == 1 and program.new_rows == 0


def test_mark_stale_of_a_row_without_a_slot_changes_nothing():
    e = engine()
    a = e.admit(5)
    assert mark_stale(e.state, np.array([a])) is e.state


def test_a_read_pool_is_rewritten_only_when_its_stream_changed():
    e = engine(whisper_like(), buckets=(1, 2))
    a = e.admit(4, ctx=9)
    _, p_new = e.resident_step([a])
    assert p_new.run_len.size == 2  # narrow+self pages, then the cross span
    e.host_step([a], tokens=2)  # self moved, context did not
    _, p_stale = e.resident_step([a])
    assert p_stale.rows_whole == 1 and p_stale.run_len.size == 1
    assert p_stale.run_cells.size == e.layout.narrow + 2  # 7 stored + 1: two self pages, no cross pages
    e.host_step([a], tokens=1, new_context=True)
    _, p_ctx = e.resident_step([a])
    assert p_ctx.run_len.size == 2 and p_ctx.run_col[1] == e.layout.span("cross").start


def test_a_read_pool_has_no_crossings_and_no_write_location():
    e = engine(whisper_like(page_size=4), buckets=(1,))
    a = e.admit(5, ctx=8)  # context exactly two pages: L % ps == 0 must not stage a cross cell
    e.resident_step([a])
    _, program = e.resident_step([a])
    assert program.crossings == 0
    assert "cross" not in e.ex.buffers[1].write_loc


# -- slots: displacement, cooling, release, offload ---------------------------------------------------------------
def _run_each_alone(e: SimEngine, handles):
    for h in handles:
        e.resident_step([h])


def test_a_new_row_with_no_free_slot_displaces_the_least_recently_run_request():
    e = engine(qwen_like(page_size=16), buckets=(1, 2))  # 5 slots: 4 usable
    hs = [e.admit(2) for _ in range(5)]
    _run_each_alone(e, hs[:4])  # runs 0,1,2,3 in that order; all four slots held
    before, program = e.resident_step([hs[4]])
    assert program.displaced.tolist() == [hs[0]]
    assert e.state.slot(hs[0]) == 0 and e.state.slot(hs[4]) == before.slot(hs[0])


def test_victims_ties_go_in_the_order_rows_took_their_slots_not_by_slot_number():
    e = engine(qwen_like(page_size=16), buckets=(1, 2))  # 5 slots: 4 usable
    x, a = e.admit(2), e.admit(2)
    e.resident_step([x])  # x: slot 1
    e.resident_step([a])  # a: slot 2, taken second
    e.finish(x)
    e.resident_step([a])
    e.commit_pending()  # slot 1 is free again
    b = e.admit(2)
    e.resident_step([a, b])  # b takes slot 1 (taken third); a and b now tie on their last run
    assert e.state.slot(b) < e.state.slot(a)
    c, d = e.admit(2), e.admit(2)
    e.resident_step([c, d])
    _, program = e.resident_step([e.admit(2)])
    assert program.displaced.tolist() == [a]  # a took its slot first, though b's slot number is lower


def test_victims_never_include_a_slot_an_uncommitted_step_read_even_when_short():
    """LRU order alone already puts the uncommitted step's rows last; the rule is what refuses to take them when
    nothing else is left (unreachable with 2B+1 slots), instead of overwriting a row the GPU may still read."""
    from resplan.planner import _victims

    e = engine(qwen_like(page_size=16), buckets=(1, 2))
    hs = [e.admit(2) for _ in range(4)]
    _run_each_alone(e, hs)  # hs[3] ran last and is uncommitted
    st = e.state
    with pytest.raises(PlanError, match="out of slots: 4 more needed, 3 displaceable"):
        _victims(st, st.slot_owner, st.slot_read, st.ledger.slot_taken, np.zeros(1, np.int64), 4)
    victims = _victims(st, st.slot_owner, st.slot_read, st.ledger.slot_taken, np.zeros(1, np.int64), 3)
    assert st.slot_owner[victims].tolist() == hs[:3]


def test_a_step_never_displaces_its_own_rows_or_the_uncommitted_steps_rows():
    e = engine(qwen_like(page_size=16), buckets=(1, 2))  # 4 usable slots
    a, b, c, d = (e.admit(2) for _ in range(4))
    e.resident_step([a, b])
    e.resident_step([c, d])  # pending: c, d are read by the uncommitted step
    x = e.admit(2)
    _, program = e.resident_step([a, x])  # a is oldest but in the step: b must go
    assert program.displaced.tolist() == [b]


def test_a_released_slot_cools_until_the_commit_of_the_last_step_that_read_it():
    lay = qwen_like(page_size=16)
    st = build_planner(lay, bucket_plans(lay, (1,)), 8)
    hs = HostStreams.zeros(lay, 8)
    hs.kv["kv"].lengths[:] = 1
    st, _ = plan(st, Step(np.array([0]), 1, 0), hs)
    slot = st.slot(0)
    st = release(st, 0)
    assert slot in st.cooling().tolist() and slot not in st.free().tolist()
    st2, p = plan(st, Step(np.array([1]), 1, 1), hs)  # step 0 is uncommitted: 1 must not take its slot
    assert st2.slot(1) != slot
    st = commit(st, 0)
    assert slot in st.free().tolist()
    st.check()


def test_release_and_offload_give_the_slot_up_and_a_reload_is_written_whole():
    e = engine()
    a, b = e.admit(5), e.admit(6)
    e.resident_step([a, b])
    e.offload(a)
    assert e.state.slot(a) == 0
    _, program = e.resident_step([a, b])
    assert program.new_rows == 1 and program.rows_whole == 1
    e.finish(b)
    assert e.state.slot(b) == 0


def test_ranks_with_the_same_history_displace_the_same_requests():
    def history(seed):
        e = engine(qwen_like(page_size=4), buckets=(1, 2), seed=seed)
        hs = [e.admit(3) for _ in range(7)]
        out = []
        for i in range(40):
            _, p = e.resident_step([hs[i % 7], hs[(i * 3 + 1) % 7]] if i % 7 != (i * 3 + 1) % 7 else [hs[i % 7]])
            out.append((p.displaced.tolist(), p.slot_row.tolist() if p.slot_row is not None else None))
        return out

    assert history(0) == history(1)  # page ids differ by seed; slots and victims depend only on plan history


# -- purity -------------------------------------------------------------------------------------------------------
def test_an_abandoned_plan_leaves_the_state_as_it_was_and_holds_no_slots():
    e = engine()
    a, b = e.admit(4), e.admit(7)
    e.resident_step([a])
    before = e.state
    snapshot = [x.copy() for x in (before.slot_owner, before.slot_of, before.row_ok, before.slot_read)]
    st, program = e.plan_only([a, b])
    assert st.slot(b) != 0 and program.new_rows == 1
    for x, y in zip(snapshot, (before.slot_owner, before.slot_of, before.row_ok, before.slot_read), strict=True):
        assert np.array_equal(x, y)
    assert e.state.slot(b) == 0  # the engine kept the old state: b holds nothing
    _, again = e.resident_step([a, b])  # and the retry plans b afresh
    assert again.new_rows == 1


def test_a_plan_that_raises_changes_nothing():
    e = engine(qwen_like(page_size=4, max_seq_len=16))  # 4 pages a row
    a, b = e.admit(3), e.admit(5)
    e.resident_step([a])
    e.host_step([a], tokens=0)  # a is stale now
    e.streams.kv["kv"].lengths[b] = 16  # b's next token would need a 5th page: the plan must raise
    before_ok = e.state.row_ok.copy()
    with pytest.raises(PlanError, match="needs 5 pages, its row holds 4"):
        e.plan_only([a, b])
    assert np.array_equal(e.state.row_ok, before_ok) and not e.state.row_ok[a]


def test_planning_behind_two_uncommitted_steps_is_refused():
    lay = qwen_like()
    st = build_planner(lay, bucket_plans(lay, (1,)), 4)
    hs = HostStreams.zeros(lay, 4)
    hs.kv["kv"].lengths[:] = 1
    st, _ = plan(st, Step(np.array([0]), 1, 0), hs)
    st, _ = plan(st, Step(np.array([0]), 1, 1), hs)
    with pytest.raises(PlanError, match="both uncommitted"):
        plan(st, Step(np.array([0]), 1, 2), hs)
    st = commit(st, 0)
    plan(st, Step(np.array([0]), 1, 2), hs)


def test_a_plan_at_or_below_the_committed_seq_is_refused():
    """A host-planned step committed seq 5 without a plan of its own. A plan numbered 5 or lower would read slots as if
    that step had committed already: a release of one of its rows would free the slot at once, while the step has
    not run, and the next plan could hand it out."""
    lay = qwen_like()
    st = build_planner(lay, bucket_plans(lay, (1,)), 4)
    hs = HostStreams.zeros(lay, 4)
    hs.kv["kv"].lengths[:] = 1
    st, _ = plan(st, Step(np.array([0]), 1, 0), hs)
    st = commit(st, 5)
    for seq in (3, 5):
        with pytest.raises(PlanError, match=f"step seq {seq} is not after the committed step 5"):
            plan(st, Step(np.array([1]), 1, seq), hs)
    st, _ = plan(st, Step(np.array([1]), 1, 6), hs)
    slot = st.slot(1)
    assert slot not in release(st, 1).free().tolist()  # step 6 has not committed: the slot cools


# -- bad input: a clear error, nothing changed --------------------------------------------------------------------
def test_a_step_larger_than_its_bucket_is_refused():
    with pytest.raises(ValueError, match="does not fit bucket 2"):
        Step(np.arange(3), 2, 0)


def test_negative_handles_are_refused():
    with pytest.raises(ValueError, match=">= 0"):
        Step(np.array([1, -1]), 2, 0)


def test_a_trusted_step_is_the_checked_step_without_its_checks():
    h = np.array([4, 1, 7])
    checked, trusted = Step(h, 4, 9, 2), Step.trusted(h, 4, 9, 2)
    assert [getattr(trusted, f.name) for f in attrs.fields(Step)] == [getattr(checked, f.name) for f in
                                                                       attrs.fields(Step)]  # fmt: skip
    assert Step.trusted(h, 4, 9).tokens == 1
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        trusted.seq = 10
    Step.trusted(np.array([1, -1]), 2, 0)  # (the caller vouches for its handles: no check)


@pytest.mark.parametrize("rows", [[0, 0], [1, 2, 1]], ids=["new-dup", "mixed-dup"])
def test_duplicate_handles_in_a_step_are_refused(rows):
    e = engine()
    a, b = e.admit(3), e.admit(3)
    e.resident_step([a])
    before = e.state
    handles = [[a, b][i] for i in rows] if max(rows) < 2 else [a, b, a]
    with pytest.raises(PlanError, match="appears twice"):
        e.plan_only(handles)
    assert e.state is before


def test_duplicate_handles_in_a_steady_step_are_refused():
    e = engine()
    a, b = e.admit(3), e.admit(3)
    e.resident_step([a, b])
    with pytest.raises(PlanError, match="appears twice"):
        e.plan_only([a, a])


def test_a_stream_with_more_pages_than_its_span_is_an_error_at_its_row():
    e = engine(qwen_like(page_size=4, max_seq_len=8))  # 2 pages a row
    a = e.admit(3)
    e.resident_step([a])
    e.streams.kv["kv"].lengths[a] = 8  # the 9th token needs a third page
    with pytest.raises(PlanError, match=f"request {a}: pool 'kv' stream needs 3 pages, its row holds 2"):
        e.plan_only([a])


def test_a_step_of_more_tokens_than_a_page_is_refused_and_a_step_of_none_is_no_step():
    e = engine(buckets=(1, 2))
    a = e.admit(3)
    with pytest.raises(PlanError, match="runs 5 tokens a row, more than a page"):
        plan(e.state, Step(np.array([a]), 1, 1, tokens=5), e.streams)  # (page size 4: two pages could open)
    with pytest.raises(PlanError, match="runs 0 tokens a row: a step runs at least one"):
        plan(e.state, Step(np.array([a]), 1, 1, tokens=0), e.streams)


def test_an_uncaptured_bucket_is_refused():
    e = engine(buckets=(1, 2))
    a = e.admit(3)
    with pytest.raises(PlanError, match="bucket 4 is not captured"):
        plan(e.state, Step(np.array([a]), 4, 1), e.streams)


def test_a_handle_outside_the_capacity_is_refused():
    e = engine()
    with pytest.raises(PlanError, match=r"outside \[0, 32\)"):
        plan(e.state, Step(np.array([40]), 1, 1), e.streams)


def test_page_size_must_be_positive():
    with pytest.raises(ValueError, match="page_size must be > 0"):
        KVPool("kv", 0, 16, 64)


def test_streams_of_an_unknown_pool_are_refused():
    lay = qwen_like()
    other = RowLayout((KVPool("other", 4, 16, 64),), "other", True, True)
    with pytest.raises(ValueError, match=r"streams have pools \['other'\], the layout has \['kv'\]"):
        HostStreams.zeros(other, 4).check(lay, 4)


def test_a_read_pool_cannot_carry_positions():
    with pytest.raises(ValueError, match="positions must ride an APPEND pool"):
        RowLayout((KVPool("ctx", 4, 16, 64, StreamMode.READ),), "ctx", False, False)
