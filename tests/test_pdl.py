"""The PDL switch (kernels/pdl.py): off in Triton's interpreter and off the GPU whatever is asked, so CPU runs never
pass ``launch_pdl``; the kernels' PDL branch is exercised compiled by the GPU tests (tests/test_engine_gpu.py)."""

from __future__ import annotations

import pytest
import torch

import kernels.pdl as pdl


def test_pdl_is_off_in_the_interpreter_or_without_a_gpu():
    if torch.cuda.is_available() and not pdl.os.environ.get("TRITON_INTERPRET"):
        pytest.skip("a compiled GPU run: tests/test_engine_gpu.py covers PDL there")
    try:
        for value in (None, True, False):
            pdl.set_enabled(value)
            assert not pdl.enabled()
            assert pdl.launch_options() == {"PDL": False}
    finally:
        pdl.set_enabled(None)


def test_set_enabled_false_turns_it_off_everywhere():
    try:
        pdl.set_enabled(False)
        assert not pdl.enabled() and pdl.launch_options() == {"PDL": False}
    finally:
        pdl.set_enabled(None)
