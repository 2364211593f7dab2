"""Text -> ids -> batches: corpora, SentencePiece tokenizer and token-budget batching."""

from .batching import (
    Batch,
    BatchIterator,
    TokenBatchSampler,
    collate,
    encode_source_batch,
    token_lengths,
)
from .dataset import (
    DataConfig,
    cache_root,
    encode_split,
    filter_train_pairs,
    load_split,
)
from .errors import DataError
from .tokenizer import SpecialIds, Tokenizer, TokenizerConfig, train_or_load_tokenizer

__all__ = [
    "Batch",
    "BatchIterator",
    "DataConfig",
    "DataError",
    "SpecialIds",
    "TokenBatchSampler",
    "Tokenizer",
    "TokenizerConfig",
    "cache_root",
    "collate",
    "encode_source_batch",
    "encode_split",
    "filter_train_pairs",
    "load_split",
    "token_lengths",
    "train_or_load_tokenizer",
]
