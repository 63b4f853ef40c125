"""HybridServe's service: the engine's model repository served over REST and gRPC.

Bottom to top: `settings`, `errors` and `admin_token`; `tensors` (wire formats to numpy and
back); `dataplane` (inference, metadata, repository operations, metrics: what both protocols
call); `runtime` (what one process shares); `rest` and `grpc`, siblings; `__main__` starts both.
"""
