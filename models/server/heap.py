"""The heap a serving process starts from: what start-up made (the model, the modules, the captured graphs' records,
the tokenizer, the routes) moved out of the garbage collector's reach once, so that the collections serving triggers
scan only what serving made. vLLM's and SGLang's servers do this after start-up, and ``models.bench``'s in-process
runs do it before each timed run (``arms.frozen_heap``): without it a collection of the old generations walks
millions of start-up objects and stalls a step or a stream's write."""

from __future__ import annotations

import gc
import time


def freeze_heap() -> int:
    """Collect, then freeze every live object (``gc.freeze``); returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class CollectorClock:
    """The seconds the cyclic garbage collector has held this process (``seconds``, all generations) since it was made:
    a ``gc.callbacks`` pair around every collection. A serving process's collections stop it whole: the engine's stall
    a step for every stream, the front end's every stream's chunks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began

    def close(self) -> None:
        gc.callbacks.remove(self._on)
