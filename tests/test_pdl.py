"""The PDL switch (kernels/pdl.py): off in Triton's interpreter and off the GPU whatever is asked, so CPU runs never
pass ``launch_pdl``; the kernels' PDL branch is exercised compiled by the GPU tests (tests/test_engine_gpu.py). What
is asked comes from the caller (``KernelChoices.pdl``), or the process default ``RESPLAN_PDL``, which an engine reads
once (``KernelChoices.resolved``)."""

from __future__ import annotations

import pytest
import torch

import kernels.pdl as pdl
from kernels.choices import KernelChoices


def test_pdl_is_off_in_the_interpreter_or_without_a_gpu():
    if torch.cuda.is_available() and not pdl.os.environ.get("TRITON_INTERPRET"):
        pytest.skip("a compiled GPU run: tests/test_engine_gpu.py covers PDL there")
    for asked in (None, True, False):
        assert not pdl.enabled(asked) and not KernelChoices(pdl=asked).launches_pdl()
        assert pdl.launch_options(asked) == {"PDL": False}


def test_asking_for_no_pdl_turns_it_off_everywhere(monkeypatch):
    monkeypatch.setenv("RESPLAN_PDL", "1")
    assert not pdl.enabled(False) and pdl.launch_options(False) == {"PDL": False}


def test_the_process_default_follows_resplan_pdl(monkeypatch):
    """None asks for the environment's choice: "0" is off wherever PDL is supported (and off where it is not)."""
    monkeypatch.setenv("RESPLAN_PDL", "0")
    assert not pdl.enabled(None)
    monkeypatch.setattr(pdl, "_supported", lambda: True)  # as on an H200
    assert not pdl.enabled(None) and pdl.enabled(True)
    monkeypatch.setenv("RESPLAN_PDL", "1")
    assert pdl.enabled(None) and pdl.launch_options(None) == {"PDL": True, "launch_pdl": True}


def test_resolved_choices_fix_the_process_default_once(monkeypatch):
    """An engine's choices are resolved at construction: None becomes RESPLAN_PDL's choice then, a later change of the
    variable reaches none of its launches, and a choice made explicitly is kept as it is."""
    monkeypatch.setenv("RESPLAN_PDL", "0")
    off = KernelChoices().resolved()
    monkeypatch.setenv("RESPLAN_PDL", "1")
    on = KernelChoices().resolved()
    assert off.pdl is False and on.pdl is True
    monkeypatch.setattr(pdl, "_supported", lambda: True)  # as on an H200
    monkeypatch.setenv("RESPLAN_PDL", "0")
    assert on.launches_pdl() and not off.launches_pdl()
    mine = KernelChoices(pdl=True, fold_norm=False)
    assert mine.resolved() is mine
