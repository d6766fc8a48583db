"""The PDL switch (kernels/pdl.py): off in Triton's interpreter and off the GPU whatever is asked, so CPU runs never
pass ``launch_pdl``; the kernels' PDL branch is exercised compiled by the GPU tests (tests/test_engine_gpu.py). What
is asked comes from the caller (``KernelChoices.pdl``), or the process default ``RESPLAN_PDL``, which an engine reads
once (``KernelChoices.resolved``). ``pdl_wait``'s instructions are checked in the PTX it compiles to for sm_90."""

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


def test_the_process_default_is_read_at_each_call(monkeypatch):
    """``process_default``: on unless RESPLAN_PDL is "0", read from the environment when it is called."""
    monkeypatch.delenv("RESPLAN_PDL", raising=False)
    assert pdl.process_default()
    monkeypatch.setenv("RESPLAN_PDL", "0")
    assert not pdl.process_default()
    monkeypatch.setenv("RESPLAN_PDL", "1")
    assert pdl.process_default()


PTX_PROBE = '''
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.pdl import pdl_wait

@triton.jit
def _bump(x_ptr, PDL: tl.constexpr):
    pdl_wait(PDL)
    tl.store(x_ptr, tl.load(x_ptr) + 1)

for on in (True, False):
    src = ASTSource(_bump, signature={"x_ptr": "*fp32", "PDL": "constexpr"}, constexprs={"PDL": on})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    print(on, "griddepcontrol.launch_dependents" in ptx, "griddepcontrol.wait" in ptx)
'''


def test_pdl_wait_emits_the_launch_and_the_wait_only_under_pdl(tmp_path):
    """``pdl_wait`` compiled for sm_90 (no GPU needed; in a process of its own, outside the interpreter): with PDL the
    PTX lets the next kernel launch and waits for the previous one, without PDL it holds neither instruction."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    probe = tmp_path / "probe.py"
    probe.write_text(PTX_PROBE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH"))
                                        if p)  # fmt: skip
    out = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["True True True", "False False False"], out.stdout
