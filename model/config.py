"""Model hyper-parameters as one dataclass; `conf/model/*.yaml` holds the values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

# The values of ModelConfig's variant fields (below); `__post_init__` checks them.
Activation = Literal["relu", "gelu", "silu"]
PositionLayout = Literal["interleaved", "halves", "fairseq"]  # see `positional.sinusoid_table`
ACTIVATIONS: tuple[Activation, ...] = get_args(Activation)
POSITION_LAYOUTS: tuple[PositionLayout, ...] = get_args(PositionLayout)


@dataclass
class ModelConfig:
    """Shape of an encoder-decoder Transformer (Vaswani et al. 2017, Table 3).

    `src_vocab_size`, `tgt_vocab_size` and `pad_id` come from the tokenizer at run time;
    everything else comes from a preset (`conf/model/{tiny,small,base,big}.yaml`).
    """

    src_vocab_size: int = 0
    tgt_vocab_size: int = 0
    pad_id: int = 0
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1  # on sublayer outputs and embeddings (paper: P_drop)
    attn_dropout: float = 0.0  # on attention weights (fairseq: attention_dropout)
    act_dropout: float = 0.0  # after the feed-forward ReLU (fairseq: activation_dropout)
    norm_first: bool = False  # False = post-norm as in the paper; True = pre-norm
    share_embeddings: bool = True  # one embedding table for source and target (joint vocab)
    tie_output: bool = True  # output projection shares the target embedding (sec. 3.4)
    # Variants of imported models (scripts/import_hf.py); the defaults are the paper's model.
    activation: Activation = "relu"  # feed-forward: relu (paper, NLLB), gelu, silu (OPUS-MT)
    output_bias: bool = False  # a bias on the logits (OPUS-MT's final_logits_bias)
    positions: PositionLayout = "interleaved"  # interleaved, halves (OPUS-MT), fairseq (NLLB)

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}: use one of {', '.join(ACTIVATIONS)}")
        if self.positions not in POSITION_LAYOUTS:
            raise ValueError(
                f"positions={self.positions!r}: use one of {', '.join(POSITION_LAYOUTS)}"
            )
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings=true needs one joint vocabulary, but "
                f"src_vocab_size={self.src_vocab_size} != tgt_vocab_size={self.tgt_vocab_size}; "
                "use a joint tokenizer or set model.share_embeddings=false"
            )

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads
