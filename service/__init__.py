"""HybridServe's HTTP service: FastAPI routers over the engine's model repository."""
