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
