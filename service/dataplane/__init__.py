"""The inference data plane: what REST (`service.rest`) and gRPC (`service.grpc`) both call.

Above the tensor layer (`service.tensors`, which decodes wire formats) and below the two
protocols, which are siblings: `inference` runs requests (resolve the version, check the inputs
against its config in `checks`, preprocess, batch, count in `metrics`); `metadata` describes
the server and its models (`types` are its answers); `repository` indexes, loads, unloads,
deletes and uploads models; `drain` counts the requests inside the process while it stops.
"""
