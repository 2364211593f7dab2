"""Text -> ids -> batches: corpora (`data.dataset`), tokenizers behind one interface
(`data.tokenizer`: SentencePiece in `data.spm_tokenizer`, an imported vocabulary in
`data.vocab_tokenizer`, training SentencePiece in `data.spm_train`) and
token-budget batching (`data.batching`).

Import from the modules. This file imports nothing, so that inference, which needs only the
tokenizer and `encode_source_batch`, never loads `datasets` (about 1 s).
"""
