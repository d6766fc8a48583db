"""The heap a serving process starts from: what start-up made (the model, the modules, the captured graphs' records,
the tokenizer, the routes) moved out of the garbage collector's reach once, so that the collections serving triggers
scan only what serving made. vLLM's and SGLang's servers do this after start-up, and ``models.bench``'s in-process
runs do it before each timed run (``arms.frozen_heap``): without it a collection of the old generations walks
millions of start-up objects and stalls a step or a stream's write."""

from __future__ import annotations

import gc


def freeze_heap() -> int:
    """Collect, then freeze every live object (``gc.freeze``); returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
