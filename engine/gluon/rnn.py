"""Recurrent layers ``LSTM`` and ``GRU`` on the fused ``RNN`` op (layouts ``TNC`` and ``NTC``).

They export as MXNet's Gluon layers do: every weight and bias ``Reshape``d to 1-D and joined by
``_rnn_param_concat``, begin states as ``_zeros`` nodes of shape ``(L*D, 0, H)`` named under the
caller's scope, one ``RNN`` node, and ``SwapAxis`` around it for ``NTC``. The input width (0 =
unknown) is learned from the first input, imperatively or while tracing.
"""

from __future__ import annotations

from typing import Any

from engine import nd, sym
from engine.gluon.hybrid import HybridBlock
from engine.gluon.trace import Traced, add_shape_hook, input_names, trace
from engine.sym import Symbol

_GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}


class _RNNLayer(HybridBlock):
    """Shared multi-layer (bi)directional recurrent layer."""

    def __init__(self, hidden_size: int, num_layers: int, layout: str, dropout: float,
                 bidirectional: bool, input_size: int, i2h_weight_initializer: Any,
                 h2h_weight_initializer: Any, i2h_bias_initializer: Any,
                 h2h_bias_initializer: Any, mode: str, dtype: Any = "float32",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if layout not in ("TNC", "NTC"):
            raise ValueError(f"{type(self).__name__}: layout must be 'TNC' or 'NTC', "
                             f"got {layout!r}")
        self._hidden_size, self._num_layers, self._layout = hidden_size, num_layers, layout
        self._mode, self._dropout, self._dtype = mode, dropout, dtype
        self._dir = 2 if bidirectional else 1
        self._input_size = input_size
        gates = _GATES[mode] * hidden_size
        width = input_size
        inits = (i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                 h2h_bias_initializer)
        with self.name_scope():
            for layer in range(num_layers):
                for direction in "lr"[:self._dir]:
                    shapes = ((gates, width), (gates, hidden_size), (gates,), (gates,))
                    for (name, init), shape in zip(zip(_PARAM_NAMES, inits), shapes):
                        full = f"{direction}{layer}_{name}"
                        param = self.params.get(full, shape=shape, init=init, dtype=dtype,
                                                allow_deferred_init=True)
                        setattr(self, full, param)
                width = hidden_size * self._dir

    def _set_input_width(self, shape: tuple[int, ...]) -> None:
        width = int(shape[2])
        gates = _GATES[self._mode] * self._hidden_size
        for direction in "lr"[:self._dir]:
            param = self._reg_params[f"{direction}0_i2h_weight"]
            if param.shape is None or not all(param.shape):
                param.shape = (gates, width)
        for param in self._reg_params.values():
            param._finish_deferred_init()

    def _needs_width(self) -> bool:
        return any(param.is_deferred for param in self._reg_params.values())

    def state_info(self, batch_size: int = 0) -> list[dict[str, Any]]:
        """Shape and layout of each begin state."""
        shape = (self._num_layers * self._dir, batch_size, self._hidden_size)
        count = 2 if self._mode == "lstm" else 1
        return [{"shape": shape, "__layout__": "LNC"} for _ in range(count)]

    def begin_state(self, batch_size: int = 0, func: Any = None, **kwargs: Any) -> list[Any]:
        """Zero begin states (``func`` is ``nd.zeros`` or ``sym.zeros``)."""
        func = func or nd.zeros
        states = []
        for index, info in enumerate(self.state_info(batch_size)):
            if func is sym.zeros:
                states.append(sym.zeros(info["shape"], dtype=self._dtype,
                                        name=f"{self.prefix}h0_{index}",
                                        __layout__=info["__layout__"]))
            else:
                states.append(func(info["shape"], dtype=self._dtype, **kwargs))
        return states

    def forward(self, inputs: Any, states: Any = None) -> Any:
        """``outputs``, or ``(outputs, states)`` when begin states are given."""
        skip_states = states is None
        if isinstance(inputs, Symbol):
            if skip_states:
                states = self.begin_state(0, func=sym.zeros)
            if self._needs_width():
                add_shape_hook(inputs, self._set_input_width)
            out = self._call_symbolic(inputs, *_as_list(states))
        elif self._active and skip_states:
            return self._call_cached(inputs)
        else:
            if self._needs_width():
                self._set_input_width(inputs.shape)
            if skip_states:
                states = self.begin_state(inputs.shape[self._layout.index("N")], func=nd.zeros,
                                          ctx=inputs.context)
            out = self._call_imperative(inputs, *_as_list(states))
        return out[0] if skip_states else (out[0], list(out[1:]))

    def _trace(self, count: int) -> Traced:
        return trace(self.forward, input_names(count))

    def hybrid_forward(self, F: Any, inputs: Any, *states: Any, **params: Any) -> Any:  # noqa: N803
        if self._layout == "NTC":
            inputs = F.swapaxes(inputs, dim1=0, dim2=1)
        order = [f"{direction}{layer}_{gate}_{kind}" for kind in ("weight", "bias")
                 for layer in range(self._num_layers) for direction in "lr"[:self._dir]
                 for gate in ("i2h", "h2h")]
        flat = [F.Reshape(params[name], shape=-1) for name in order]
        packed = F._rnn_param_concat(*flat, dim=0)
        rnn = F.RNN(inputs, packed, *states, state_size=self._hidden_size,
                    projection_size=None, num_layers=self._num_layers,
                    bidirectional=self._dir == 2, p=self._dropout, state_outputs=True,
                    mode=self._mode, lstm_state_clip_min=None, lstm_state_clip_max=None,
                    lstm_state_clip_nan=False, use_sequence_length=False)
        outputs = rnn[0]
        new_states = [rnn[index] for index in range(1, 1 + len(states))]
        if self._layout == "NTC":
            outputs = F.swapaxes(outputs, dim1=0, dim2=1)
        return [outputs, *new_states]


_PARAM_NAMES = ("i2h_weight", "h2h_weight", "i2h_bias", "h2h_bias")


def _as_list(states: Any) -> list[Any]:
    return list(states) if isinstance(states, (list, tuple)) else [states]


class LSTM(_RNNLayer):
    """Long short-term memory layer; states are ``[h, c]``, each ``(L*D, N, H)``."""

    def __init__(self, hidden_size: int, num_layers: int = 1, layout: str = "TNC",
                 dropout: float = 0, bidirectional: bool = False, input_size: int = 0,
                 i2h_weight_initializer: Any = None, h2h_weight_initializer: Any = None,
                 i2h_bias_initializer: Any = "zeros", h2h_bias_initializer: Any = "zeros",
                 dtype: Any = "float32", **kwargs: Any) -> None:
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                         i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, "lstm", dtype, **kwargs)


class GRU(_RNNLayer):
    """Gated recurrent unit layer; the state is ``[h]``, ``(L*D, N, H)``."""

    def __init__(self, hidden_size: int, num_layers: int = 1, layout: str = "TNC",
                 dropout: float = 0, bidirectional: bool = False, input_size: int = 0,
                 i2h_weight_initializer: Any = None, h2h_weight_initializer: Any = None,
                 i2h_bias_initializer: Any = "zeros", h2h_bias_initializer: Any = "zeros",
                 dtype: Any = "float32", **kwargs: Any) -> None:
        super().__init__(hidden_size, num_layers, layout, dropout, bidirectional, input_size,
                         i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                         h2h_bias_initializer, "gru", dtype, **kwargs)


__all__ = ["GRU", "LSTM"]
