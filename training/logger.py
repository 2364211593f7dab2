"""TensorBoard logging for training (rank 0 only): scalars, sample translations, a
cross-attention heatmap of one validation sentence, and the hyper-parameters."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.tensorboard import SummaryWriter

if TYPE_CHECKING:
    from attnmt.decoding.translator import Translator
    from attnmt.training.config import LoggerConfig

log = logging.getLogger(__name__)


class TrainLogger:
    def __init__(self, tb_dir: Path, cfg: LoggerConfig, enabled: bool) -> None:
        self.cfg = cfg
        self.writer = SummaryWriter(str(tb_dir)) if enabled and cfg.enabled else None

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.writer is None:
            return
        for name, value in values.items():
            self.writer.add_scalar(f"{prefix}/{name}", value, step)
        self.writer.flush()

    def samples(self, src: list[str], ref: list[str], hyps: list[str], step: int) -> None:
        if self.writer is None or self.cfg.n_samples <= 0:
            return
        rows = ["| source | reference | hypothesis |", "|---|---|---|"]
        for s, r, h in list(zip(src, ref, hyps, strict=True))[: self.cfg.n_samples]:
            rows.append(f"| {_md(s)} | {_md(r)} | {_md(h)} |")
        self.writer.add_text("valid/samples", "\n".join(rows), step)

    def attention(self, translator: Translator, sentence: str, step: int) -> None:
        """Cross-attention heatmap (last layer, averaged over heads) of one sentence."""
        if self.writer is None:
            return
        from attnmt.decoding.plot import heatmap_image

        src_pieces, tgt_pieces, cross = translator.attention_for(sentence)  # cross: (L, H, T, S)
        image = heatmap_image(src_pieces, tgt_pieces, cross[-1].mean(dim=0), title=f"step {step}")
        self.writer.add_image("valid/cross_attention", image, step, dataformats="HWC")

    def hparams(self, raw: dict[str, Any], best_bleu: float) -> None:
        if self.writer is None:
            return
        flat = {k: v for k, v in _flatten(raw).items() if isinstance(v, int | float | str | bool)}
        self.writer.add_hparams(flat, {"hparam/best_valid_bleu": best_bleu}, run_name=".")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out
