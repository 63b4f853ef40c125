"""``engine.gluon.nn``: Gluon's layers (Dense, Conv2D, BatchNorm, pooling, activations, ...)."""

from __future__ import annotations

from engine.gluon.block import Block
from engine.gluon.hybrid import HybridBlock
from engine.gluon.nn.activations import ELU, GELU, SELU, Activation, LeakyReLU, PReLU, Swish
from engine.gluon.nn.basic_layers import (
    BatchNorm,
    Concurrent,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    HybridConcurrent,
    HybridLambda,
    HybridSequential,
    Identity,
    InstanceNorm,
    Lambda,
    LayerNorm,
    Sequential,
)
from engine.gluon.nn.conv_layers import (
    AvgPool1D,
    AvgPool2D,
    AvgPool3D,
    Conv1D,
    Conv2D,
    Conv2DTranspose,
    Conv3D,
    GlobalAvgPool1D,
    GlobalAvgPool2D,
    GlobalAvgPool3D,
    GlobalMaxPool1D,
    GlobalMaxPool2D,
    GlobalMaxPool3D,
    MaxPool1D,
    MaxPool2D,
    MaxPool3D,
)
from engine.gluon.symbol_block import SymbolBlock

__all__ = ["ELU", "GELU", "SELU", "Activation", "AvgPool1D", "AvgPool2D", "AvgPool3D",
           "BatchNorm", "Block", "Concurrent", "Conv1D", "Conv2D", "Conv2DTranspose", "Conv3D",
           "Dense", "Dropout", "Embedding", "Flatten", "GlobalAvgPool1D", "GlobalAvgPool2D",
           "GlobalAvgPool3D", "GlobalMaxPool1D", "GlobalMaxPool2D", "GlobalMaxPool3D",
           "HybridBlock", "HybridConcurrent", "HybridLambda", "HybridSequential", "Identity",
           "InstanceNorm", "Lambda", "LayerNorm", "LeakyReLU", "MaxPool1D", "MaxPool2D",
           "MaxPool3D", "PReLU", "SELU", "Sequential", "Swish", "SymbolBlock"]
