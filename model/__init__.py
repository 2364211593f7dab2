"""The Transformer architecture: nn.Modules only, no file I/O, no text."""

from model.attention import (
    AdditiveAttention,
    AttentionOutput,
    DotProductAttention,
    KVCache,
    MultiHeadAttention,
    attention,
    causal_mask,
    lengths_to_mask,
    masked_softmax,
    padding_mask,
)
from model.config import ModelConfig
from model.layers import DecoderLayer, EncoderLayer, FeedForward
from model.positional import SinusoidalPositionalEncoding, sinusoid_table
from model.transformer import AttentionMaps, Decoder, Encoder, Transformer, log_probs

__all__ = [
    "AdditiveAttention",
    "AttentionMaps",
    "AttentionOutput",
    "Decoder",
    "DecoderLayer",
    "DotProductAttention",
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
    "lengths_to_mask",
    "log_probs",
    "masked_softmax",
    "padding_mask",
    "sinusoid_table",
]
