"""Text -> ids -> batches: corpora (`data.dataset`), SentencePiece (`data.tokenizer`) and
token-budget batching (`data.batching`).

Import from the modules. This file imports nothing, so that inference, which needs only the
tokenizer and `encode_source_batch`, never loads `datasets` (about 1 s).
"""
