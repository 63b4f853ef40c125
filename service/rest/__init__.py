"""The Open Inference Protocol (and ``/predict``, management, metrics) over HTTP: FastAPI/ASGI.

The sibling of gRPC (`service.grpc`), importing nothing of it: its routes decode their bodies
(`service.tensors`) and call the data plane (`service.dataplane`) of the process's
`service.runtime.Runtime`. `app` builds the app and its one stack: `gate` (drain, `limits` with
`content_coding`, `errors`), then `routes`' router, whose hot routes are plain ASGI endpoints
and the rest FastAPI's (`routers/`, with `deps`, `schemas` and `openapi` for the document);
`uploads` streams model uploads to disk.
"""
