"""The Transformer architecture: nn.Modules only, no file I/O, no text."""

from attnmt.model.attention import (
    AttentionOutput,
    KVCache,
    MultiHeadAttention,
    attention,
    causal_mask,
    masked_softmax,
    padding_mask,
)
from attnmt.model.config import ModelConfig
from attnmt.model.layers import DecoderLayer, EncoderLayer, FeedForward
from attnmt.model.positional import SinusoidalPositionalEncoding, sinusoid_table
from attnmt.model.transformer import AttentionMaps, Decoder, Encoder, Transformer

__all__ = [
    "AttentionMaps",
    "AttentionOutput",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "KVCache",
    "ModelConfig",
    "MultiHeadAttention",
    "SinusoidalPositionalEncoding",
    "Transformer",
    "attention",
    "causal_mask",
    "masked_softmax",
    "padding_mask",
    "sinusoid_table",
]
