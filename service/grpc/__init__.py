"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``).

It runs on the event loop of the HTTP server and calls the same `InferenceService`, repository,
batchers and metrics; only the wire format differs from the REST routes.
"""
