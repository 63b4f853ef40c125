"""Why a Symbol cannot do what an NDArray does, and what to write instead (one place, reused)."""

from __future__ import annotations

_WHY = "a Symbol describes computation, not data, so it has no values until the graph runs"

SHAPE = (f"Symbol has no attribute 'shape': {_WHY}. Use F.reshape with its special codes "
         "(0 keeps a dimension, -1 infers one, -2 keeps the rest, -3 merges two, -4 splits one) "
         "instead of computing shapes from x.shape, or call symbol.infer_shape(data=(...)) to "
         "ask for shapes")
DTYPE = (f"Symbol has no attribute 'dtype': {_WHY}. Pass the dtype as a constructor argument "
         "(for example Dense(..., dtype='float16')) or convert with F.cast(x, dtype=...); "
         "symbol.infer_type(data='float32') computes dtypes")
CONTEXT = (f"Symbol has no attribute 'context': {_WHY}. The device is chosen when the model is "
           "loaded (engine.load_model(..., device='gpu')); pass constants as constructor "
           "arguments or parameters rather than arrays on a context")
ASNUMPY = (f"Symbol has no attribute 'asnumpy': {_WHY}. Run the graph with "
           "engine.load_model(symbol, params).infer({...}), or call the block imperatively with "
           "NDArrays (before hybridize()) to look at values")
INDEX = ("Symbol only support integer index to fetch i-th output (got {got}): {why}. To slice "
         "data use F.slice_axis(x, axis=..., begin=..., end=...) or F.slice(x, begin=(...), "
         "end=(...)); to pick elements use F.take or F.pick")
SETITEM = ("'Symbol' object does not support item assignment: Symbols are immutable graph "
           "nodes. Build a new value instead: F.where(mask, new, old) to replace elements, or "
           "F.slice_axis and F.concat to assemble pieces")
INPLACE = ("Symbol does not support the in-place operator '{op}': Symbols are immutable graph "
           "nodes. Write x = x {plain} y, which creates a new Symbol")
BOOL = (f"Symbol has no truth value: {_WHY}, so Python 'if'/'while' cannot branch on it while "
        "tracing. Use F.where(condition, a, b) to select values, or branch on Python values "
        "(constructor arguments)")
