"""A tokenizer's state -> the tokenizer that wrote it (the factory over the two classes of
``data/tokenizer.py``'s interface)."""

from __future__ import annotations

from attnmt.data.errors import DataError
from attnmt.data.spm_tokenizer import SpmTokenizer
from attnmt.data.tokenizer import STATE_FORMAT, Tokenizer
from attnmt.data.vocab_tokenizer import VocabTokenizer


def load_tokenizer(state: dict) -> Tokenizer:
    """Rebuild a tokenizer from its ``state_dict`` (e.g. a checkpoint's ``tokenizer`` entry):
    an imported model's state holds its vocabulary, our own models' do not.

    Raises:
        DataError: the state comes from an incompatible version of attnmt.
    """
    versions = (SpmTokenizer.STATE_VERSION, VocabTokenizer.STATE_VERSION)
    if state.get("format") != STATE_FORMAT or state.get("version") not in versions:
        raise DataError(
            f"tokenizer state has format {state.get('format')!r} version "
            f"{state.get('version')!r}, expected {STATE_FORMAT!r} version {versions[0]} "
            f"or {versions[1]}; the checkpoint comes from an incompatible version of attnmt"
        )
    if "vocab" in state:
        return VocabTokenizer.from_state_dict(state)
    return SpmTokenizer.from_state_dict(state)
