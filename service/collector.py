"""What the garbage collector's full passes scan in the server process, kept small.

A full pass (generation 2) holds the GIL from its first object to its last, on whichever thread
triggered it, so the event loop answers nothing meanwhile: health probes and requests of other
models wait for it. Its length is that of the objects it scans, so what lives as long as the
process is frozen out of them (`gc.freeze`): the imports and the models loaded at start
(`Runtime.start`), and numba's compiler, which the first load that compiles a kernel would
otherwise set up in its middle and leave in every later pass: about 90,000 objects (with
ResNet-18 loaded a pass took 51 ms of CPU, 5 ms with them frozen first,
`bench/full_collection.py`; an upload triggers several). The server's loader is therefore
`CompilerFrozenFirst`, which sets numba up and freezes it before the first CPU load. The price
falls on servers whose models never compile with numba (MLPs): numba set up in full, 50-67 MiB
more for the process. A loaded model's own objects stay unfrozen, so that the collection after
an unload (`engine.serving.control.reclaim_memory`) frees its cycles.
"""

from __future__ import annotations

import gc
import logging
import threading
from typing import Any

from engine.cpu import compiled
from engine.serving.validate import Loader, ServableModel

log = logging.getLogger(__name__)


def freeze_lasting() -> None:
    """Keep every object alive now out of the collector's later passes (for what lives as
    long as the process)."""
    gc.freeze()


class CompilerFrozenFirst:
    """A loader that, on its first call for the CPU, sets up numba's compiler
    (`compiled.prepare`) and freezes it, before the model's own objects exist.

    The young generations are collected first (the set-up's leftovers; its older garbage went
    in the full passes it triggered itself), not the whole heap: that pass is what the freeze
    spares. Loads run one at a time on the repository's I/O thread; the lock is for a caller
    that loads on others.
    """

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self._lock = threading.Lock()
        self._frozen = False

    def __call__(self, symbol: Any, params: Any, *, device: str = "cpu",
                 **options: Any) -> ServableModel:
        if not self._frozen and device != "gpu":
            with self._lock:
                if not self._frozen:
                    if _prepared():
                        gc.collect(1)
                        freeze_lasting()
                    self._frozen = True
        return self.loader(symbol, params, device=device, **options)


def _prepared() -> bool:
    """`compiled.prepare`, whose failure leaves the loads as they were (each kernel then meets
    what failed where it compiles, as without this step)."""
    try:
        return compiled.prepare()
    except Exception:  # noqa: BLE001 - numba's errors have no common base worth naming
        log.warning("setting up numba's compiler before the first load failed", exc_info=True)
        return False
