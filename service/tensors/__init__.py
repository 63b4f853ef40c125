"""Tensors on the wire: request bodies to numpy arrays, and outputs back, for REST and gRPC.

The bottom of the service's layers, below the data plane (`service.dataplane`): it knows wire
formats, not models' configs. `datatypes` holds what every format shares (datatype names, the
bounds on a tensor's rank and element count); `json` is the one JSON reader (simdjson, orjson
below a size or on refusal; its depth bound); `binary` the binary-tensor extension; `v2` and
`predict` the two REST bodies built on them; `images`, `text` and `multipart` the inputs that
arrive as images or texts; `postprocess` and `classification` the outputs a model's config or
the request asks to be answered differently. gRPC's protobuf tensors are read in
`service.grpc.tensors`, through the same datatypes and binary layouts.
"""
