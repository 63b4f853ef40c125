"""Tiny sequence models (GluonNLP Transformer, RNN language models) and an ArcFace-style net."""

from __future__ import annotations

import gluonnlp as nlp
import mxnet as mx
import numpy as np
from gluonnlp.model.transformer import get_transformer_encoder_decoder
from mxnet.gluon import nn

Batches = list[dict[str, np.ndarray]]
VOCAB = 30


class Translator(mx.gluon.HybridBlock):
    """GluonNLP's Transformer encoder and decoder between two embeddings, masked by lengths.

    NMTModel itself is not hybridizable, so this wires the same parts the way it does:
    the encoder reads the source under its valid length, the decoder attends causally to the
    target and to the memory under the source mask, and a Dense projects to the vocabulary.
    Positions come from the token arrays themselves, which also fixes their rank for servers
    that read input ranks off the graph (an Embedding alone accepts any rank).
    """

    def __init__(self, units: int = 16, vocab: int = VOCAB, **kwargs: object) -> None:
        super().__init__(**kwargs)
        encoder, decoder, _ = get_transformer_encoder_decoder(
            num_layers=1, num_heads=2, units=units, hidden_size=2 * units, dropout=0.0,
            max_src_length=16, max_tgt_length=16)
        with self.name_scope():
            self.src_embed = nn.Embedding(vocab, units)
            self.tgt_embed = nn.Embedding(vocab, units)
            self.encoder = encoder
            self.decoder = decoder
            self.project = nn.Dense(vocab, flatten=False)

    def hybrid_forward(self, F, src, src_length, tgt, tgt_length):  # noqa: N803
        memory, _ = self.encoder(self.src_embed(src), valid_length=src_length)
        positions = F.contrib.arange_like(src, axis=1)  # token positions, (batch, length) in
        memory_mask = F.broadcast_lesser(positions.reshape((1, -1)), src_length.reshape((-1, 1)))
        decoded, _, _ = self.decoder(self.tgt_embed(tgt), [memory, memory_mask], tgt_length)
        steps = F.contrib.arange_like(tgt, axis=1)
        target_mask = F.broadcast_lesser(steps.reshape((1, -1)), tgt_length.reshape((-1, 1)))
        # padded steps give zero logits rather than the projection's bias
        return F.broadcast_mul(self.project(decoded), F.expand_dims(target_mask, -1))


def build_transformer() -> mx.gluon.HybridBlock:
    return Translator()


def translator_batches(rng: np.random.Generator) -> Batches:
    batches = []
    for size in (1, 3):
        batches.append({
            "data0": rng.integers(0, VOCAB, (size, 6)).astype(np.float32),  # source tokens
            "data1": rng.integers(1, 7, (size,)).astype(np.float32),  # source lengths
            "data2": rng.integers(0, VOCAB, (size, 5)).astype(np.float32),  # target tokens
            "data3": rng.integers(1, 6, (size,)).astype(np.float32),  # target lengths
        })
    return batches


class BatchFirstLM(mx.gluon.HybridBlock):
    """GluonNLP's StandardRNN (time-major, TNC) behind the batch-first interface servers expect.

    Tokens come in as (batch, steps); logits go out as (batch, steps, vocab) and every final
    state as (batch, layers, units), so that each output keeps the batch dimension first.
    """

    def __init__(self, mode: str, layers: int, tie_weights: bool, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.model = nlp.model.StandardRNN(mode, VOCAB, 16, 16, layers, dropout=0.0,
                                               tie_weights=tie_weights)

    def hybrid_forward(self, F, tokens):  # noqa: N803 (Gluon's signature)
        logits, states = self.model(F.transpose(tokens))
        return [F.transpose(logits, axes=(1, 0, 2))] + [F.swapaxes(state, 0, 1)
                                                        for state in states]


def build_lstm_lm() -> mx.gluon.HybridBlock:
    """2 LSTM layers of 16 units, the decoder tied to the embedding."""
    return BatchFirstLM("lstm", 2, tie_weights=True)


def build_gru_lm() -> mx.gluon.HybridBlock:
    """1 GRU layer of 16 units."""
    return BatchFirstLM("gru", 1, tie_weights=False)


def token_batches(rng: np.random.Generator) -> Batches:
    """Tokens, batch first: 5 steps, batch 1 and 2."""
    return [{"data": rng.integers(0, VOCAB, (size, 5)).astype(np.float32)} for size in (1, 2)]


class ArcFaceNet(mx.gluon.HybridBlock):
    """InsightFace-style embedding net: conv-BN-PReLU units, BatchNorm with fixed gamma
    (``scale=False``) on the embedding, L2-normalised features and cosine class logits."""

    def __init__(self, classes: int = 6, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.classes = classes
        with self.name_scope():
            self.body = nn.HybridSequential(prefix="")
            for channels in (8, 16):
                self.body.add(nn.Conv2D(channels, 3, strides=2, padding=1, use_bias=False),
                              nn.BatchNorm(epsilon=2e-5), nn.PReLU())
            self.body.add(nn.BatchNorm(epsilon=2e-5, scale=False), nn.Flatten(), nn.Dense(16),
                          nn.BatchNorm(epsilon=2e-5, scale=False))
            self.centres = self.params.get("centres", shape=(classes, 16))

    def hybrid_forward(self, F, x, centres):  # noqa: N803 (Gluon's signature)
        embedding = self.body(x)
        unit = F.L2Normalization(embedding, mode="instance")
        cosine = F.FullyConnected(unit, F.L2Normalization(centres, mode="instance"),
                                  no_bias=True, num_hidden=self.classes)
        return embedding, cosine


def build_arcface() -> mx.gluon.HybridBlock:
    return ArcFaceNet()


# Exports as GluonNLP users make them for serving: every block exported as it is, with its own
# layout (the language models stay time-major), small but not toy-sized, batches of 1 and 4.
SERVING_VOCAB = 100


def build_bert_masked() -> mx.gluon.HybridBlock:
    """GluonNLP's BERTModel with pooler, next-sentence classifier and masked-LM decoder: 2
    layers, 64 units, vocabulary 100; inputs token ids, token types, valid length and masked
    positions."""
    encoder = nlp.model.BERTEncoder(num_layers=2, units=64, hidden_size=128, max_length=64,
                                    num_heads=4, dropout=0.0, output_attention=False,
                                    output_all_encodings=False)
    return nlp.model.BERTModel(encoder, vocab_size=SERVING_VOCAB, token_type_vocab_size=2,
                               units=64, embed_size=64, use_pooler=True, use_decoder=True,
                               use_classifier=True)


def bert_masked_batches(rng: np.random.Generator) -> Batches:
    batches = []
    for size in (1, 4):
        length, masked = 8, 3
        batches.append({
            "data0": rng.integers(0, SERVING_VOCAB, (size, length)).astype(np.float32),
            "data1": rng.integers(0, 2, (size, length)).astype(np.float32),
            "data2": rng.integers(2, length + 1, (size,)).astype(np.float32),
            "data3": np.stack([rng.choice(length, masked, replace=False)
                               for _ in range(size)]).astype(np.float32),
        })
    return batches


class StatefulLM(mx.gluon.HybridBlock):
    """GluonNLP's StandardRNN called with its begin states as inputs, as a streaming client
    feeds them back: tokens (steps, batch), states (layers, batch, units), all time-major."""

    def __init__(self, mode: str, **kwargs: object) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.model = nlp.model.StandardRNN(mode, SERVING_VOCAB, 32, 32, 2, dropout=0.0,
                                               tie_weights=False)

    def hybrid_forward(self, F, tokens, *states):  # noqa: N803 (Gluon's signature)
        return self.model(tokens, list(states))


def build_lstm_lm_tnc() -> mx.gluon.HybridBlock:
    """2 LSTM layers of 32 units with the begin states as inputs (h and c)."""
    return StatefulLM("lstm")


def build_gru_lm_tnc() -> mx.gluon.HybridBlock:
    """GluonNLP's StandardRNN GRU (2 layers, 32 units) exported as it is: tokens in, its own
    zero begin state, logits and the final state out, all time-major."""
    return nlp.model.StandardRNN("gru", SERVING_VOCAB, 32, 32, 2, dropout=0.0,
                                     tie_weights=False)


def lstm_tnc_batches(rng: np.random.Generator) -> Batches:
    """Tokens (6 steps, batch) with h and c (2 layers, batch, 32)."""
    return [{"data0": rng.integers(0, SERVING_VOCAB, (6, size)).astype(np.float32),
             "data1": rng.normal(0, 0.5, (2, size, 32)).astype(np.float32),
             "data2": rng.normal(0, 0.5, (2, size, 32)).astype(np.float32)}
            for size in (1, 4)]


def gru_tnc_batches(rng: np.random.Generator) -> Batches:
    """Tokens, time-major: 6 steps, batch 1 and 4."""
    return [{"data": rng.integers(0, SERVING_VOCAB, (6, size)).astype(np.float32)}
            for size in (1, 4)]


def build_transformer_small() -> mx.gluon.HybridBlock:
    """The Translator above at 32 units, 1 encoder and 1 decoder layer."""
    return Translator(units=32, vocab=SERVING_VOCAB)


def transformer_small_batches(rng: np.random.Generator) -> Batches:
    return [{
        "data0": rng.integers(0, SERVING_VOCAB, (size, 7)).astype(np.float32),
        "data1": rng.integers(1, 8, (size,)).astype(np.float32),
        "data2": rng.integers(0, SERVING_VOCAB, (size, 5)).astype(np.float32),
        "data3": rng.integers(1, 6, (size,)).astype(np.float32),
    } for size in (1, 4)]
