"""Test-wide settings and the one tiny Transformer the model and decoding tests share.

`tiny_config(**overrides)` and `tiny_model(**overrides)` are fixtures that return factories:
`tiny_model(norm_first=True)`, or, for search tests, `tiny_model(seed=2, **SEARCH_MODEL)`
(`tests.helpers_decoding`). `tokenizer`, `model` and `checkpoint` are what the translate.py
tests run: a tiny SentencePiece model on `PAIRS`, the search model with its vocabulary, and
both saved as a run dir's `checkpoints/best.pt`. Test helpers are imported as `from tests.<module> import ...`
(tests/ is a package), which works under both `pytest` and `python -m pytest`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from attnmt.checkpoint import model_payload, save_checkpoint
from attnmt.data.tokenizer import Tokenizer
from attnmt.model import ModelConfig, Transformer
from tests.helpers_decoding import SEARCH_MODEL, tiny_tokenizer

VOCAB = 40  # source = target vocabulary of the tiny model; id 0 is pad


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_test_process():
    # 2-core machines: in-process tests run single-threaded so that they do not fight the
    # subprocesses (train.py / translate.py / DDP ranks) that other tests start.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_tiny_config(**overrides) -> ModelConfig:
    """d_model 32, 2 heads, d_ff 64, 2 + 2 layers, vocabulary 40, dropout 0.1; `overrides` win."""
    fields = dict(
        src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, pad_id=0, d_model=32, n_heads=2, d_ff=64,
        n_encoder_layers=2, n_decoder_layers=2, dropout=0.1,
    )  # fmt: skip
    fields.update(overrides)
    return ModelConfig(**fields)


def make_tiny_model(
    vocab_size: int | None = None,
    seed: int | None = None,
    output_std: float | None = None,
    **overrides,
) -> Transformer:
    """The tiny Transformer in eval mode.

    Args:
        vocab_size: source and target vocabulary (default 40).
        seed: `torch.manual_seed` first (else the caller's RNG state decides the weights).
        output_std: redraw the output layer's weights from N(0, output_std) (needs
            tie_output=False): random, sharper logits, so that greedy outputs vary in length.
        overrides: ModelConfig fields.
    """
    if vocab_size is not None:
        overrides = {"src_vocab_size": vocab_size, "tgt_vocab_size": vocab_size, **overrides}
    if seed is not None:
        torch.manual_seed(seed)
    model = Transformer(make_tiny_config(**overrides))
    if output_std is not None:
        with torch.no_grad():
            model.generator.weight.normal_(0.0, output_std)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_config() -> Callable[..., ModelConfig]:
    return make_tiny_config


@pytest.fixture(scope="session")
def tiny_model() -> Callable[..., Transformer]:
    return make_tiny_model


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return tiny_tokenizer(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="session")
def model(tokenizer: Tokenizer, tiny_model) -> torch.nn.Module:  # noqa: ANN001
    return tiny_model(vocab_size=tokenizer.src_vocab_size, seed=2, **SEARCH_MODEL)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, model, tokenizer) -> Path:  # noqa: ANN001
    path = tmp_path_factory.mktemp("run") / "checkpoints" / "best.pt"
    save_checkpoint(path, model_payload(model, tokenizer))
    return path
