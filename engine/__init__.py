"""HybridServe's engine: operators, graphs, the hybrid frontend, the compiler and runtime."""
