"""Recurrent-state saves taken inside a prefill pass (a prefix cache's checkpoints, ``PrefillInput.saves``): the state
pass's saves (Triton's interpreter on the CPU) against its torch reference; a tiny float32 Qwen3.5's pass with saves
against prefilling each prefix alone (plain and fused paths, exact and bucket shapes, fresh and continuing chunks,
several chunks of which only some save); the layout's refusals."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_gdn_prefill import _state_case, _used_rows  # noqa: E402

from kernels.gdn_prefill.naive import state_pass_ref  # noqa: E402
from kernels.gdn_prefill.state_pass import state_pass_  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(not (INTERPRET or torch.cuda.is_available()), reason="needs Triton's interpreter")


@needs_triton
@pytest.mark.parametrize("dk", [64, 128])
def test_the_state_pass_stores_the_states_entering_the_saved_rows_and_the_saved_finals(dk):
    """Random save rows (most 0) and final saves into spare slots: the saved states equal the reference's (which are
    the h rows and final states), every other slot but the sink untouched."""
    lens = [130, 1, 0, 200, 70, 9, 0]
    slots = [4, 7, 2, 1, 6, 0, 0]
    fresh = [False, True, False, False, True, True, True]
    case = _state_case(0, lens, slots, fresh, hk=2, hv=4, dk=dk, dv=48)
    case["pool"] = torch.cat([case["pool"], torch.randn(8, *case["pool"].shape[1:])])  # slots 10..17 spare
    rows = case["chunk_rows"]
    save = torch.zeros(rows, dtype=torch.int64)
    save[[1, 2, 5, 6]] = torch.tensor([10, 11, 12, 13])  # seq 0's chunks 1, 2; seq 3's chunks 1, 2 (rows 4..7)
    final = torch.tensor([14, 0, 0, 15, 16, 0, 0])
    saves = dict(save_slot=save, final_slot=final)
    want_pool = case["pool"].clone()
    want_h, want_v = state_pass_ref(**{**case, "pool": want_pool}, **saves)
    got_pool = case["pool"].clone()
    h, v_new = state_pass_(**{**case, "pool": got_pool}, **saves)
    used = _used_rows(lens)
    torch.testing.assert_close(h[used], want_h[used], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(v_new, want_v, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_pool[1:], want_pool[1:], atol=1e-4, rtol=1e-4)  # slot 0: the sink's race
    for row, slot in zip([1, 2, 5, 6], [10, 11, 12, 13], strict=True):  # the reference saves what it says
        torch.testing.assert_close(want_pool[slot], want_h[row])
    for s, slot in [(0, 14), (3, 15), (4, 16)]:
        torch.testing.assert_close(want_pool[slot], want_pool[slots[s]])
    untouched = [3, 5, 8, 9, 17]
    assert torch.equal(got_pool[untouched], case["pool"][untouched])


def test_the_state_pass_takes_save_and_final_slots_together():
    case = _state_case(0, [5, 0], [1, 0], [True, True], hk=1, hv=1, dk=64, dv=16)
    with pytest.raises(ValueError, match="together"):
        state_pass_(**case, save_slot=torch.zeros(case["chunk_rows"], dtype=torch.int64))
