"""resplan.held on a CPU: finding the CUDA runtime among a process's mappings (its launches run on the GPU:
tests/test_graph_gpu.py)."""

from __future__ import annotations

from resplan.held import runtime_path

MAPS = """\
7f0000000000-7f0000001000 r--p 00000000 103:02 1234 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000002000-7f0000003000 r-xp 00001000 103:02 5678 /venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
7f0000006000-7f0000007000 r--p 00000000 103:02 91 /opt/my libs/libcudart_static_helper.a
"""


def test_the_runtime_is_the_first_libcudart_shared_library_mapped():
    assert runtime_path(MAPS) == "/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13"


def test_no_runtime_among_the_mappings_is_none():
    lines = [ln for ln in MAPS.splitlines() if "libcudart.so" not in ln]
    assert runtime_path("\n".join(lines)) is None
    assert runtime_path("") is None


def test_a_path_with_spaces_is_read_whole():
    maps = "7f00-7f01 r-xp 00000000 103:02 7 /opt/cuda 13/lib64/libcudart.so.13.0.48\n"
    assert runtime_path(maps) == "/opt/cuda 13/lib64/libcudart.so.13.0.48"


def _fake_runtime(rc: int, calls: list):
    """A stand-in for libcudart: its three calls record their arguments and return ``rc``."""
    import types

    def launch(graph_exec, stream):
        calls.append(("launch", graph_exec, stream))
        return rc

    def record(event, stream):
        calls.append(("record", event, stream))
        return rc

    def copy(dst, src, nbytes, kind, stream):
        calls.append(("copy", dst, src, nbytes, kind, stream))
        return rc

    def words(code):
        return b"an illegal memory access was encountered" if code == 700 else b"no error"

    return types.SimpleNamespace(cudaGraphLaunch=launch, cudaEventRecord=record, cudaMemcpyAsync=copy,
                                 cudaGetErrorString=words)  # fmt: skip


def test_held_calls_pass_the_raw_handles_and_raise_the_runtimes_words_on_an_error():
    import pytest

    from resplan.held import HeldCuda

    calls: list = []
    ok = HeldCuda(_fake_runtime(0, calls))
    ok.launch(0x1234, 0x77)
    ok.record(0x99, 0x77)
    ok.copy_h2d(0x5000, 0x6000, 48, 0x77)
    assert calls == [("launch", 0x1234, 0x77), ("record", 0x99, 0x77), ("copy", 0x5000, 0x6000, 48, 1, 0x77)]
    bad = HeldCuda(_fake_runtime(700, calls))
    with pytest.raises(RuntimeError, match=r"cudaGraphLaunch failed: an illegal memory access .*\(error 700\)"):
        bad.launch(1, 2)
    with pytest.raises(RuntimeError, match=r"cudaEventRecord failed: an illegal memory access"):
        bad.record(1, 2)
    with pytest.raises(RuntimeError, match=r"cudaMemcpyAsync failed: an illegal memory access"):
        bad.copy_h2d(1, 2, 4, 3)
