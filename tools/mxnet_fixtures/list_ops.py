"""Write MXNet's registered operator names, each classified, as ``engine/ops/mxnet_ops.json``.

Usage (inside the fixture venv)::

    python tools/mxnet_fixtures/list_ops.py --out engine/ops/mxnet_ops.json

A name is ``excluded`` (with the reason) when no inference export can contain it: backward ops,
optimizer updates, random sampling, sparse storage, quantized or backend-subgraph ops, MXNet's
internals, training-only ops (KL sparsity regularisation, MultiBoxTarget, the Hawkes process
log-likelihood), ``_set_value`` (NDArray's ``x[:] = v``) and image decoding. Loss heads with a
forward (SVMOutput, MakeLoss, CTCLoss...) and the assignment ops a symbol graph can hold
(``_slice_assign``, ``_npi_boolean_mask_assign_*``...) are forward operators.
``Custom`` is ``unsupported``: it runs user Python code. Every other name is a forward operator
and starts as ``todo``; ``python -m engine.ops.coverage --write`` then marks those the engine
registers as ``supported``. Statuses already in the file (``supported``, ``unsupported``) are
kept. A name that MXNet registered as an alias of another op carries ``alias_of``: MXNet writes
the other name when it saves a graph.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
from pathlib import Path

import mxnet as mx
from mxnet.base import _LIB, OpHandle, c_str, check_call, py_str

# (regular expression over the name, reason), first match wins.
EXCLUDED = (
    (r"(^_backward|_backward$|^_contrib_backward|_backward_|^_npi_backward)", "backward op"),
    (r"(_update$|_update_phase\d$|^(multi_)?all_finite$|^multi_lars$|^multi_sum_sq$"
     r"|^reset_arrays$)", "optimizer update"),
    (r"(^_?random_(?!pdf)|^_?sample_|^_npi_(bernoulli|choice|exponential|gamma|gumbel|laplace"
     r"|logistic|multinomial|normal|normal_n|pareto|rayleigh|uniform|uniform_n|weibull"
     r"|random_randint|shuffle)$|^_?shuffle$|^normal$|^uniform$)", "random sampling"),
    (r"(^_sparse_|^cast_storage$|^_contrib_getnnz$|^sparse_retain$|^_contrib_SparseEmbedding$)",
     "sparse storage"),
    (r"(^_contrib_dgl_|^_contrib_edge_id$)", "sparse CSR graph op (DGL)"),
    (r"(^_sg_|quantiz|^_contrib_requantize$|^_contrib_dequantize$|^_contrib_calibrate_entropy$)",
     "quantized or backend-subgraph op"),
    (r"^(_CachedOp|_CachedOpThreadSafe|_CustomFunction|_NDArray|_Native|_CrossDeviceCopy"
     r"|_NoGradient|_npi_share_memory|_copyto|_npi_copyto)$", "MXNet internal"),
    (r"(^IdentityAttachKLSparseReg$|MultiBoxTarget$|multibox_target$|^_grad_add$"
     r"|^_contrib_hawkesll$)", "training-only op"),
    (r"^_set_value$", "in-place assignment (NDArray setitem)"),
    (r"(imdecode|imread|^_cvimresize$|^_npi_cvimresize$|^_cvcopyMakeBorder$|_image_random_)",
     "image decoding or random augmentation (data pipeline)"),
)
UNSUPPORTED = {
    "Custom": "runs user Python code registered with mx.operator; a model file cannot carry it "
              "and the engine never executes code from a model",
    "_npi_Custom": "NumPy-mode Custom: runs user Python code, never executed by the engine",
}


def classify(name: str) -> dict[str, str]:
    """The record for one name: excluded or unsupported with a reason, else a forward ``todo``."""
    if name in UNSUPPORTED:
        return {"status": "unsupported", "reason": UNSUPPORTED[name]}
    for pattern, reason in EXCLUDED:
        if re.search(pattern, name):
            return {"status": "excluded", "reason": reason}
    return {"status": "todo"}


def canonical_name(name: str) -> str:
    """The name MXNet writes for ``name``: an alias resolves to the op it was added to."""
    handle = OpHandle()
    check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    real, text, kwargs, returns = (ctypes.c_char_p() for _ in range(4))
    count = ctypes.c_uint()
    names, types, docs = (ctypes.POINTER(ctypes.c_char_p)() for _ in range(3))
    check_call(_LIB.MXSymbolGetAtomicSymbolInfo(
        handle, ctypes.byref(real), ctypes.byref(text), ctypes.byref(count), ctypes.byref(names),
        ctypes.byref(types), ctypes.byref(docs), ctypes.byref(kwargs), ctypes.byref(returns)))
    return py_str(real.value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    previous = json.loads(args.out.read_text())["operators"] if args.out.exists() else {}
    operators = {}
    for name in sorted(mx.operator.get_all_registered_operators()):
        record = classify(name)
        kept = previous.get(name, {})
        if record["status"] == "todo" and kept.get("status") in ("supported", "unsupported"):
            record = kept
        canonical = canonical_name(name)
        if canonical != name:
            record = {**record, "alias_of": canonical}
        operators[name] = record
    document = {"mxnet_version": mx.__version__,
                "source": "mx.operator.get_all_registered_operators()",
                "generator": "tools/mxnet_fixtures/list_ops.py",
                "operators": operators}
    args.out.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    print(f"wrote {len(operators)} names to {args.out}")


if __name__ == "__main__":
    main()
