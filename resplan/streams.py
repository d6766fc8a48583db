"""The host truth the planner reads and never owns: per request handle, numpy arrays the engine keeps current.

A request is a small integer **handle** in ``[0, capacity)``; the engine recycles handles and calls ``release`` on the
planner before it reuses one. Every array is indexed by handle, so a step's view of the truth is a gather, never a
per-request Python object.
"""

from __future__ import annotations

import attrs
import numpy as np

from resplan.layout import SAMPLER_CELLS, RowLayout


@attrs.frozen(eq=False)
class KVStreams:
    """One pool's streams. ``pages[h, j]`` is the page holding tokens [j*ps, (j+1)*ps) of handle h."""

    pages: np.ndarray  # [H, Wh] int32, Wh >= 1; entries past a stream's pages are ignored
    lengths: np.ndarray  # [H] int64 (it indexes tables on the step path), tokens stored; a step writes token L
    epoch: np.ndarray  # [H] int64, bumped by the owner whenever a host step changes the stream (READ pools read it)

    @classmethod
    def zeros(cls, capacity: int, width: int) -> KVStreams:
        return cls(
            pages=np.zeros((capacity, width), np.int32),
            lengths=np.zeros(capacity, np.int64),
            epoch=np.zeros(capacity, np.int64),
        )


@attrs.frozen(eq=False)
class HostStreams:
    """Everything a row mirrors, by handle. Arrays are the engine's; the planner only reads them."""

    kv: dict[str, KVStreams]
    pos_offset: np.ndarray | None = None  # [H] int32
    recurrent_slot: np.ndarray | None = None  # [H] int32 (0 = the sink slot, never a live request's)
    sampler: np.ndarray | None = None  # [H, 4] int32: temperature, top_p (float32 bits), top_k, seed

    @property
    def capacity(self) -> int:
        return next(iter(self.kv.values())).lengths.shape[0]

    @classmethod
    def zeros(cls, layout: RowLayout, capacity: int, page_width: int | None = None) -> HostStreams:
        """Empty streams shaped for ``layout``; ``page_width`` defaults to each pool's span width."""
        return cls(
            kv={p.key: KVStreams.zeros(capacity, page_width or p.span_width) for p in layout.pools},
            pos_offset=np.zeros(capacity, np.int32) if layout.positions_pool is not None else None,
            recurrent_slot=np.zeros(capacity, np.int32) if layout.recurrent else None,
            sampler=np.zeros((capacity, len(SAMPLER_CELLS)), np.int32) if layout.sampler else None,
        )

    def check(self, layout: RowLayout, capacity: int) -> None:
        """Raise ValueError naming the first array whose presence, shape or dtype does not fit ``layout``."""
        keys = {p.key for p in layout.pools}
        if set(self.kv) != keys:
            raise ValueError(f"streams have pools {sorted(self.kv)}, the layout has {sorted(keys)}")
        for key, s in self.kv.items():
            _expect(f"kv[{key!r}].pages", s.pages, (capacity, None), np.int32)
            _expect(f"kv[{key!r}].lengths", s.lengths, (capacity,), np.int64)
            _expect(f"kv[{key!r}].epoch", s.epoch, (capacity,), np.int64)
        for name, wanted, shape in (
            ("pos_offset", layout.positions_pool is not None, (capacity,)),
            ("recurrent_slot", layout.recurrent, (capacity,)),
            ("sampler", layout.sampler, (capacity, len(SAMPLER_CELLS))),
        ):
            arr = getattr(self, name)
            if wanted and arr is None:
                raise ValueError(f"the layout has {name} cells but the streams have no {name} array")
            if arr is not None:
                _expect(name, arr, shape, np.int32)


def _expect(name: str, arr: np.ndarray, shape: tuple, dtype) -> None:
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype != dtype:
        raise ValueError(f"{name} must be {np.dtype(dtype).name}, got {arr.dtype}")
    if arr.ndim != len(shape) or any(w is not None and w != a for w, a in zip(shape, arr.shape, strict=True)):
        want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(arr.shape)}")
