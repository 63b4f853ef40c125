"""``engine.gluon``: the hybrid frontend — Blocks, Parameters, layers, export and import.

Example::

    from engine import nd
    from engine.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation='relu'), nn.Dense(2))
    net.initialize()
    net.hybridize()
    y = net(nd.random.normal(shape=(1, 512)))   # traced once, then a compiled plan
    net.export('my_mlp')                         # my_mlp-symbol.json, my_mlp-0000.params
"""

from __future__ import annotations

from engine.gluon import initializer, nn, rnn
from engine.gluon import initializer as init
from engine.gluon.block import Block
from engine.gluon.hybrid import HybridBlock
from engine.gluon.parameter import (
    Constant,
    DeferredInitializationError,
    Parameter,
    ParameterDict,
)
from engine.gluon.symbol_block import SymbolBlock

__all__ = ["Block", "Constant", "DeferredInitializationError", "HybridBlock", "Parameter",
           "ParameterDict", "SymbolBlock", "init", "initializer", "nn", "rnn"]
