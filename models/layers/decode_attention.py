"""Which kernel a decode bucket's attention runs. A vendor's name belongs here, in the attention layer; what the
planner keeps of it is only whether a bucket needs a host plan (``resplan.BucketPlan.host_plan_free``)."""

from __future__ import annotations

import enum


class Backend(enum.Enum):
    """A decode attention (``models.layers.flashinfer_attention.make_decode_attention`` builds it)."""

    TORCH = "torch"  # plain-torch paged attention reading the gathered tables (CPU, tests)
    FA2 = "fa2"  # FlashInfer's fa2 decode wrapper: its schedule is built on the host every step
    XQA = "xqa"  # FlashInfer XQA (sm_90): reads the gathered block table and lengths in the graph
    TRITON = "triton"  # our split-KV Triton kernel (kernels/paged_decode): reads them in the graph too

    @property
    def host_plan_free(self) -> bool:
        """It reads a bucket's gathered block table and lengths itself: nothing is built on the host before a replay."""
        return self is not Backend.FA2
