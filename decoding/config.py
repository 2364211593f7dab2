"""Decoding options: the one definition of their names, defaults, limits and help text.

`SearchConfig` is what the search functions and `Translator` take; `conf/decoding/*.yaml` hold
only what differs from its defaults, and the `translate.py` flags are generated from its
fields (`cli.translate`). Imports nothing heavy (no torch), so the command line can be checked
before torch loads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args

LengthPenaltyType = Literal["fairseq", "gnmt"]
LP_TYPES: tuple[str, ...] = get_args(LengthPenaltyType)
# Usual alphas are 0.6-2; beyond this, length**alpha overflows a float for long outputs.
MAX_LENGTH_PENALTY = 20.0


def _option(
    default: Any,
    help: str,
    minimum: float | None = None,
    flag: str = "",
    *,
    above: float | None = None,
    maximum: float | None = None,
) -> Any:
    """A dataclass field whose metadata holds the help text, the bounds (`min` and `max`
    inclusive, `above` exclusive) and the CLI flag (default: `--` + the name with dashes).
    Help texts name other options by field name; the CLI shows them as flags. The bounds are
    the one statement of each limit: `SearchConfig` checks them, the server's request types
    (`server.options`) are built from them."""
    meta = {"help": help, "min": minimum, "above": above, "max": maximum, "flag": flag}
    return field(default=default, metadata=meta)


def bounds_text(meta: Any) -> str:
    """A field's bounds (its metadata) as a message says them: ">= 1", "in (0, 1]"."""
    low, above, high = meta.get("min"), meta.get("above"), meta.get("max")
    if high is not None:
        return f"in {'(' if above is not None else '['}{low if above is None else above}, {high}]"
    return f"> {above}" if above is not None else f">= {low}"


def within_bounds(value: Any, meta: Any) -> bool:
    low, above, high = meta.get("min"), meta.get("above"), meta.get("max")
    return not (
        (low is not None and value < low)
        or (above is not None and value <= above)
        or (high is not None and value > high)
    )


@dataclass
class SearchConfig:
    """Greedy/beam search and sampling options (validated on construction).

    Defaults follow fairseq's usual WMT settings (`--beam 5 --lenpen 1 --max-len-a 1.2
    --max-len-b 10`). With `sampling`, each sentence gets `nbest` independent samples instead
    of a search (`beam_size` is not used); `topk`, `topp` and `temperature` shape the
    distribution sampled from (fairseq's `--sampling-topk/--sampling-topp/--temperature`).
    """

    beam_size: int = _option(5, "hypotheses kept per sentence; 1 = greedy search", 1, "--beam")
    length_penalty: float = _option(
        1.0,
        "alpha: hypotheses are ranked by log-prob / length penalty (see lp_type); 0 = raw log-prob",
        -MAX_LENGTH_PENALTY,
        maximum=MAX_LENGTH_PENALTY,
    )
    lp_type: LengthPenaltyType = _option(
        "fairseq", "length penalty formula: fairseq = len**alpha, gnmt = ((5 + len) / 6)**alpha"
    )
    max_len_a: float = _option(
        1.2, "output length limit per sentence: int(max_len_a * src_len + max_len_b) tokens", 0
    )
    max_len_b: int = _option(10, "see max_len_a", 0)
    nbest: int = _option(1, "hypotheses returned per sentence, best first (<= beam_size)", 1)
    batch_size: int = _option(64, "sentences per search batch (greedy: sentences in flight)", 1)
    sampling: bool = _option(
        False, "sample each next token instead of searching; nbest = samples per sentence"
    )
    topk: int = _option(0, "sampling: draw from the k most probable tokens only; 0 = all", 0)
    topp: float = _option(
        1.0,
        "sampling: draw from the smallest set of tokens whose probability reaches p",
        above=0,
        maximum=1,
    )
    temperature: float = _option(
        1.0, "sampling: divide the logits by this; < 1 sharpens, > 1 flattens", above=0
    )
    seed: int = _option(1, "sampling: random seed; the same seed and input give the same output")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):  # NaN passes every <
                raise ValueError(f"{f.name} must be a finite number, got {value}")
            if not within_bounds(value, f.metadata):
                raise ValueError(f"{f.name} must be {bounds_text(f.metadata)}, got {value}")
        if self.nbest > self.beam_size and not self.sampling:
            raise ValueError(f"nbest must be in 1..beam_size={self.beam_size}, got {self.nbest}")
        if self.lp_type not in LP_TYPES:
            raise ValueError(f"lp_type must be 'fairseq' or 'gnmt', got {self.lp_type!r}")


PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")  # autocast dtypes a search runs in


@dataclass(frozen=True)
class RunDecoding:
    """How a training run decoded its test scores: the search, the autocast precision and the
    device type it ran on. `train.py` writes it as "decoding" in `results.json` and in every
    checkpoint (`as_dict`); `translate.py` and `serve.py` decode that way unless a flag or a
    request field says otherwise (`from_stored`)."""

    search: SearchConfig
    precision: str = "fp32"  # resolved: fp32 | bf16 | fp16 (never "auto")
    device: str = "cpu"  # the device type the test ran on: cpu | cuda

    def as_dict(self) -> dict[str, Any]:
        """The stored form: the `SearchConfig` fields, then "precision" and "device" (plain
        values only, so `torch.load(weights_only=True)` reads it)."""
        return {**asdict(self.search), "precision": self.precision, "device": self.device}

    @classmethod
    def from_stored(cls, stored: Any) -> RunDecoding | None:
        """The record `as_dict` wrote, or None when there is none (a checkpoint written before
        runs recorded their decoding, an imported model). Keys this code does not know are
        ignored, so a newer record still loads.

        Raises:
            ValueError: the record holds a value `SearchConfig` rejects, or an unknown
                precision.
        """
        if not isinstance(stored, dict):
            return None
        names = {f.name for f in fields(SearchConfig)}
        search = SearchConfig(**{k: v for k, v in stored.items() if k in names})
        precision = stored.get("precision", "fp32")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {'|'.join(PRECISIONS)}, got {precision!r}")
        return cls(search, precision, str(stored.get("device", "cpu")))
