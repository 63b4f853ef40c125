"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``).

The sibling of the REST app (`service.rest`), importing nothing of it: it runs on the same
event loop and calls the same data plane (`service.dataplane`: the `InferenceService`, the
repository operations, batchers and metrics) over the same `service.runtime.Runtime`; only the
wire format differs.
"""
