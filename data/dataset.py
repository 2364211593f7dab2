"""Corpora -> ``datasets.Dataset`` of ``(src, tgt)`` strings -> cached token ids.

Two sources give the same result, a memory-mapped Arrow dataset with string columns ``src`` and
``tgt`` in corpus order:

* a local folder (``data.dir``) of ``<split>.<lang>`` UTF-8 files, optionally gzipped, read
  once by streaming and cached as Arrow under the cache dir (key: paths, sizes, mtimes);
* a Hugging Face dataset (``data.hub_name`` [+ ``data.hub_config``]) from the Hub, or a
  directory written by ``save_to_disk`` / holding data files (JSON lines, Parquet, ...). Both
  Hub schemas work: a ``translation`` column of ``{lang: text}`` dicts (wmt14, iwslt2017,
  opus_books) and one column per language (bentrevett/multi30k).

``data.dir`` wins when both are set. Nothing is ever written next to the corpus (it may be
read-only): caches go to ``data.cache_dir``, else ``$ATTNMT_CACHE``, else ``~/.cache/attnmt``.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import re
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import zip_longest
from pathlib import Path
from typing import BinaryIO

import datasets
from datasets.arrow_writer import ArrowWriter
from tqdm import tqdm

from attnmt.common.files import atomic_write
from attnmt.data.errors import DataError
from attnmt.data.glossary import Glossary
from attnmt.data.terms import TermAnnotation, annotate_pair, dictionary_glossary, learn_dictionary
from attnmt.data.tokenizer import Tokenizer, check_tag

log = logging.getLogger(__name__)

# Bump when the layout of a cached file changes, so that old caches are ignored.
_CACHE_VERSION = "1"
_TEXT_FEATURES = datasets.Features(
    {"src": datasets.Value("string"), "tgt": datasets.Value("string")}
)
_ENCODED_FEATURES = datasets.Features(
    {
        "src": datasets.Value("string"),
        "tgt": datasets.Value("string"),
        "src_ids": datasets.Sequence(datasets.Value("int32")),
        "tgt_ids": datasets.Sequence(datasets.Value("int32")),
        "src_len": datasets.Value("int32"),
        "tgt_len": datasets.Value("int32"),
    }
)
# Hub datasets name their dev split differently; a requested name maps to the first present.
_SPLIT_ALIASES = {
    "valid": ("validation", "dev"),
    "validation": ("valid", "dev"),
    "dev": ("validation", "valid"),
}
# Added to both character counts before taking the length ratio, so short pairs such as
# "OK." / "In Ordnung." (3 vs 11 characters) are not mistaken for misalignments.
_RATIO_SMOOTHING = 5
_WRITE_BATCH = 10_000  # lines per Arrow record batch when caching a local corpus
_NOT_LANGS = {"md", "txt", "tsv", "csv", "log", "cfg", "ini", "yml", "yaml", "json", "sh", "py"}


@dataclass
class DataConfig:
    """Hydra group ``data`` (one key per field).

    Attributes:
        dir: Local folder of ``<split>.<lang>`` files (``.gz`` allowed); wins over ``hub_name``.
        hub_name: Hub dataset (``bentrevett/multi30k``, ``wmt14``) or a ``save_to_disk`` dir.
        hub_config: Hub config name, e.g. ``de-en`` for wmt14.
        hub_splits: Our split name -> the Hub's, where they differ (``{test2016: test}``).
            Without an entry, ``valid`` also finds ``validation`` or ``dev``.
        src_lang: Source language code (file suffix / column / translation key).
        tgt_lang: Target language code.
        train_split: Split to train on.
        valid_split: Split for validation; ``valid`` also finds a Hub ``validation`` split.
        test_splits: Splits scored after training, e.g. ``[test2016, test2017]``.
        max_len: Training pairs with more SentencePiece tokens than this on either side are
            dropped (eos/bos not counted). Never applied to valid/test.
        max_len_ratio: Training pairs whose character-length ratio (longer / shorter, each
            plus 5 characters) exceeds this are dropped as likely misaligned; 0 disables.
        cache_dir: Where Arrow caches go; None -> ``$ATTNMT_CACHE`` or ``~/.cache/attnmt``.
            Hub downloads also go below it when it is set (else Hugging Face's own cache).
        num_proc: Processes for filtering and encoding (batched ``datasets`` maps); 0 means
            one per CPU core for splits of 50k pairs or more, in-process for smaller ones.
        corpora: Several training corpora in one run, ``{name: {key: value}}`` (see
            :class:`Corpus`); empty: the one corpus the keys above name. A corpus's keys
            default to the ones above; a relative ``dir`` is taken under ``dir`` above.
        valid_from: With ``corpora``: the corpora whose ``valid_split`` is validated on
            (concatenated); required.
        test_from: With ``corpora``: the corpora whose ``test_splits`` are scored, each as
            ``<corpus>.<split>``; None: the ``valid_from`` corpora.
        term_annotation: Source terms annotated inline with their target terms in the
            training split (:class:`attnmt.data.terms.TermAnnotation`: ``mode``, ``terms``,
            ``rate``, ...); empty or ``mode: none``: off.
    """

    dir: str | None = None
    hub_name: str | None = None
    hub_config: str | None = None
    hub_splits: dict[str, str] = field(default_factory=dict)
    src_lang: str = "de"
    tgt_lang: str = "en"
    train_split: str = "train"
    valid_split: str = "valid"
    test_splits: list[str] = field(default_factory=list)
    max_len: int = 128
    max_len_ratio: float = 3.0
    cache_dir: str | None = None
    num_proc: int = 0
    corpora: dict[str, dict] = field(default_factory=dict)
    valid_from: list[str] = field(default_factory=list)
    test_from: list[str] | None = None
    term_annotation: dict = field(default_factory=dict)


# The keys a corpus of ``data.corpora`` may set besides weight and tag: where its text is.
_CORPUS_KEYS = (
    "dir", "hub_name", "hub_config", "hub_splits", "src_lang", "tgt_lang", "train_split",
    "valid_split", "test_splits", "max_len_ratio",
)  # fmt: skip


@dataclass
class Corpus:
    """One corpus of ``data.corpora``: where it is (``data``, a full :class:`DataConfig` of
    its own), its sampling ``weight`` and its ``tag``.

    ``weight`` is a share of sentence pairs: an epoch draws ``N * weight / sum(weights)``
    pairs from this corpus, ``N`` the pairs of all corpora together (fewer than it has:
    a random subset each epoch; more: every pair as often as fits, plus a random subset).
    ``tag`` (e.g. ``<2de>``, ``<BT>``) starts each source of every split of this corpus, as one
    SentencePiece piece (``tokenizer.user_symbols``)."""

    name: str
    data: DataConfig
    weight: float = 1.0
    tag: str | None = None


def corpora(cfg: DataConfig) -> list[Corpus]:
    """``cfg.corpora`` checked and completed (keys default to ``cfg``'s), in config order.

    Raises:
        DataError: an unknown key, a weight that is not positive, a bad tag, or
            ``valid_from``/``test_from`` naming no corpus of the list.
    """
    out = []
    for name, entry in cfg.corpora.items():
        entry = dict(entry or {})
        unknown = sorted(set(entry) - {*_CORPUS_KEYS, "weight", "tag"})
        if unknown:
            raise DataError(
                f"data.corpora.{name}: unknown key(s) {', '.join(unknown)}; valid keys: "
                f"{', '.join(sorted((*_CORPUS_KEYS, 'weight', 'tag')))}"
            )
        weight = entry.pop("weight", 1.0)
        if not isinstance(weight, int | float) or not weight > 0:
            raise DataError(
                f"data.corpora.{name}.weight={weight} must be a positive number (its share of "
                "the training pairs); remove the corpus instead of giving it weight 0"
            )
        tag = entry.pop("tag", None)
        if tag is not None:
            check_tag(tag, f"data.corpora.{name}.tag")
        if "dir" in entry or "hub_name" in entry:  # its own source, nothing of the default's
            entry = {"dir": None, "hub_name": None, **entry}
            if entry["dir"] and cfg.dir and not Path(entry["dir"]).expanduser().is_absolute():
                entry["dir"] = str(Path(cfg.dir).expanduser() / entry["dir"])
        base = replace(cfg, corpora={}, valid_from=[], test_from=None)
        out.append(Corpus(name, replace(base, **entry), float(weight), tag))
    if not out:
        return out
    names = [c.name for c in out]
    for key, chosen in (("valid_from", cfg.valid_from), ("test_from", cfg.test_from or [])):
        missing = [n for n in chosen if n not in names]
        if missing:
            raise DataError(
                f"data.{key} names {', '.join(missing)}, which data.corpora does not have "
                f"(corpora: {', '.join(names)})"
            )
    if not cfg.valid_from:
        raise DataError(
            f"data.corpora lists {', '.join(names)} but data.valid_from names none to validate "
            f"on; set data.valid_from=[{names[0]}] (a corpus with a valid split)"
        )
    return out


def tag_sources(ds: datasets.Dataset, tag: str | None, cfg: DataConfig) -> datasets.Dataset:
    """``ds`` with ``tag`` and a space before every source (cached); ``ds`` itself if no tag."""
    if tag is None:
        return ds
    key = _hash("tag", ds._fingerprint, tag)
    cache_file = cache_root(cfg) / "tagged" / f"{key}.arrow"
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    return ds.map(
        _prepend,
        batched=True,
        input_columns=["src"],
        fn_kwargs={"tag": tag},
        cache_file_name=str(cache_file),
        load_from_cache_file=True,
        new_fingerprint=key,
        desc=f"tagging sources with {tag}",
    )


def _prepend(srcs: list[str], tag: str) -> dict[str, list[str]]:
    return {"src": [f"{tag} {src}" for src in srcs]}


def annotate_terms(
    ds: datasets.Dataset, cfg: DataConfig, terms: TermAnnotation, given: Glossary | None
) -> datasets.Dataset:
    """The training pairs ``ds`` with their source terms annotated (cached; ``ds`` itself when
    ``terms.mode`` is ``none``): the terms of ``given`` (``terms.terms``), else a dictionary
    learnt from ``ds``, whose size and first pairs are logged, as are the sources annotated."""
    if terms.mode == "none":
        return ds
    glossary = given
    if glossary is None:
        pairs = ds.select_columns(["src", "tgt"]).iter(batch_size=_WRITE_BATCH)
        learnt = learn_dictionary(
            ((s, t) for batch in pairs for s, t in zip(batch["src"], batch["tgt"], strict=True)),
            terms,
        )
        examples = ", ".join(f"{p.source} -> {p.target} ({p.dice:.2f})" for p in learnt[:8])
        log.info(
            "term annotation: learnt %d dictionary pairs from the training pairs (min_count %d, "
            "min_dice %g, stop_words %d)%s",
            len(learnt),
            terms.min_count,
            terms.min_dice,
            terms.stop_words,
            f", e.g. {examples}" if learnt else "",
        )
        glossary = dictionary_glossary(learnt)
    listed = sorted((t.source, t.target) for t in glossary.terms)
    key = _hash("terms", ds._fingerprint, terms.mode, terms.rate, terms.seed, listed)
    cache_file = cache_root(cfg) / "annotated" / f"{key}.arrow"
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    annotated = ds.map(
        _annotate_batch,
        batched=True,
        with_indices=True,
        input_columns=["src", "tgt"],
        fn_kwargs={"glossary": glossary, "terms": terms},
        cache_file_name=str(cache_file),
        load_from_cache_file=True,
        new_fingerprint=key,
        num_proc=_num_proc(cfg, len(ds)),
        desc=f"annotating source terms ({terms.mode})",
    )
    changed = sum(
        a != b
        for batch_a, batch_b in zip(
            annotated.select_columns(["src"]).iter(batch_size=_WRITE_BATCH),
            ds.select_columns(["src"]).iter(batch_size=_WRITE_BATCH),
            strict=True,
        )
        for a, b in zip(batch_a["src"], batch_b["src"], strict=True)
    )
    log.info(
        "term annotation (%s, rate %g): %d of %d training sources annotated, %d terms",
        terms.mode,
        terms.rate,
        changed,
        len(ds),
        len(glossary),
    )
    return annotated


def _annotate_batch(
    srcs: list[str], tgts: list[str], rows: list[int], glossary: Glossary, terms: TermAnnotation
) -> dict[str, list[str]]:
    return {
        "src": [
            annotate_pair(src, tgt, glossary, terms, row)
            for src, tgt, row in zip(srcs, tgts, rows, strict=True)
        ]
    }


def cache_root(cfg: DataConfig) -> Path:
    """The directory that holds this package's Arrow caches."""
    if cfg.cache_dir:
        return Path(cfg.cache_dir).expanduser()
    return Path(os.environ.get("ATTNMT_CACHE") or Path.home() / ".cache" / "attnmt")


def _hash(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, (_CACHE_VERSION, *parts))).encode()).hexdigest()[:20]


# With data.num_proc=0 (auto), smaller splits are processed in-process.
_AUTO_NUM_PROC_MIN_ROWS = 50_000


def _num_proc(cfg: DataConfig, rows: int) -> int | None:
    """Worker processes for a map/filter over `rows` rows; None means in-process."""
    n = cfg.num_proc
    if n == 0:  # auto: every core this process may use, for splits big enough
        n = _cores() if rows >= _AUTO_NUM_PROC_MIN_ROWS else 1
    return n if n > 1 else None  # datasets wants None for in-process


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may run on
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# --- loading ----------------------------------------------------------------------------------


def load_split(cfg: DataConfig, split: str) -> datasets.Dataset:
    """Load one split as a memory-mapped dataset with string columns ``src`` and ``tgt``.

    Args:
        cfg: Data settings; ``dir`` or ``hub_name`` selects the corpus.
        split: Split name, e.g. ``train``, ``valid``, ``test2016``.

    Returns:
        The split's pairs in corpus order, unfiltered.

    Raises:
        DataError: No corpus configured, a missing split or language, sides with different
            line counts, an empty split, invalid UTF-8, or an unreachable Hub dataset.
    """
    if cfg.dir:
        return _load_local_split(cfg, split)
    if cfg.hub_name:
        return _load_hub_split(cfg, split)
    raise DataError(
        "no corpus configured: set data.dir=PATH (a folder of <split>.<lang> files) "
        "or data.hub_name=NAME (a Hugging Face dataset)"
    )


def _load_local_split(cfg: DataConfig, split: str) -> datasets.Dataset:
    root = Path(cfg.dir).expanduser()
    if not root.is_dir():
        raise DataError(
            f"data.dir={cfg.dir} is not a directory; point data.dir at a folder of "
            "<split>.<lang> files (e.g. train.de, train.en)"
        )
    src_path = _find_side(root, split, cfg.src_lang)
    tgt_path = _find_side(root, split, cfg.tgt_lang)
    stats = [
        (str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in (src_path, tgt_path)
    ]
    key = _hash("corpus", *stats)
    cache_file = cache_root(cfg) / "corpus" / f"{split}.{cfg.src_lang}-{cfg.tgt_lang}.{key}.arrow"
    if not cache_file.exists():
        log.info("caching %s + %s as Arrow in %s", src_path, tgt_path, cache_file)
        _write_corpus_arrow(src_path, tgt_path, cache_file, key)
    return datasets.Dataset.from_file(str(cache_file))


def _find_side(root: Path, split: str, lang: str) -> Path:
    plain, packed = root / f"{split}.{lang}", root / f"{split}.{lang}.gz"
    if plain.is_file():
        return plain  # preferred over .gz when both exist: it is the one a user edits
    if packed.is_file():
        return packed
    available = _local_inventory(root)
    if split in available:
        raise DataError(
            f"language {lang!r} missing for split {split!r}: no {plain} or {packed.name} "
            f"(split {split!r} has languages: {', '.join(sorted(available[split]))}); "
            "set data.src_lang/data.tgt_lang to languages that exist"
        )
    listing = "; ".join(f"{s} ({', '.join(sorted(ls))})" for s, ls in sorted(available.items()))
    raise DataError(
        f"split {split!r} not found in {root}: no {plain.name} or {packed.name} "
        f"(available splits: {listing or 'none'}); set data.train_split/data.valid_split/"
        "data.test_splits to existing splits"
    )


def _local_inventory(root: Path) -> dict[str, set[str]]:
    """``{split: {langs}}`` of the ``<split>.<lang>[.gz]`` files in ``root``, for messages."""
    found: dict[str, set[str]] = {}
    for name in os.listdir(root):
        name = name.removesuffix(".gz")
        match = re.fullmatch(r"(.+)\.([A-Za-z]{2,3}(?:[_-][A-Za-z0-9]+)?)", name)
        if match and match.group(2).lower() not in _NOT_LANGS:
            found.setdefault(match.group(1), set()).add(match.group(2))
    return found


def iter_corpus_lines(path: Path) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (maybe gzipped), without the line terminator.

    Reads bytes and splits on ``\\n`` only: text mode's universal newlines would also split on
    a lone ``\\r`` (and ``str.splitlines`` on U+2028 etc.) and silently misalign the two sides.
    """
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                if raw.endswith(b"\n"):
                    raw = raw[:-1]
                if raw.endswith(b"\r"):
                    raw = raw[:-1]  # CRLF files from Windows
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{path}: line {number} is not valid UTF-8 (byte {e.start + 1}: "
                        f"{e.reason}); convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8"
                    ) from None
                if number == 1 and text.startswith("\ufeff"):
                    text = text[1:]  # a byte-order mark is an encoding artefact, not text
                yield text
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"cannot read {path} ({e}); check or re-download the file") from e


def _iter_pairs(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """Yield aligned line pairs; raises DataError naming both counts if the sides differ."""
    src_lines, tgt_lines = iter_corpus_lines(src_path), iter_corpus_lines(tgt_path)
    count = 0
    for src, tgt in zip_longest(src_lines, tgt_lines):
        if src is None or tgt is None:
            # Count the rest of the longer side so the message gives both full counts.
            rest = 1 + sum(1 for _ in (tgt_lines if src is None else src_lines))
            n_src, n_tgt = (count, count + rest) if src is None else (count + rest, count)
            longer = tgt_path if src is None else src_path
            raise DataError(
                f"line counts differ: {src_path} has {n_src} lines but {tgt_path} has "
                f"{n_tgt} (line {count + 1} of {longer} has no counterpart); the two sides "
                "of a split must be line-aligned, one sentence per line"
            )
        count += 1
        yield src, tgt


def _write_corpus_arrow(src_path: Path, tgt_path: Path, cache_file: Path, key: str) -> None:
    """Stream both files into one Arrow file, a record batch at a time (bounded memory).

    Written atomically: concurrent ranks may race, and a reader must never see half a file.
    """

    def write(stream: BinaryIO) -> None:
        n_pairs = 0
        with ArrowWriter(features=_TEXT_FEATURES, stream=stream, fingerprint=key) as writer:
            batch: dict[str, list[str]] = {"src": [], "tgt": []}
            pairs = tqdm(
                _iter_pairs(src_path, tgt_path),
                desc=f"reading {src_path.name} + {tgt_path.name}",
                unit=" pairs",
                disable=not sys.stderr.isatty(),  # a bar on a terminal only
            )
            for src, tgt in pairs:
                batch["src"].append(src)
                batch["tgt"].append(tgt)
                if len(batch["src"]) == _WRITE_BATCH:
                    writer.write_batch(batch)
                    n_pairs += _WRITE_BATCH
                    batch = {"src": [], "tgt": []}
            if batch["src"]:
                writer.write_batch(batch)
                n_pairs += len(batch["src"])
            if n_pairs == 0:
                raise DataError(
                    f"empty corpus: {src_path} and {tgt_path} have no lines; "
                    "fill them or point data.dir at the right folder"
                )
            writer.finalize(close_stream=False)  # atomic_write fsyncs and closes it

    atomic_write(cache_file, write)


def _load_hub_split(cfg: DataConfig, split: str) -> datasets.Dataset:
    splits = _open_hub(cfg)
    name = _resolve_split(cfg.hub_splits.get(split, split), list(splits), cfg.hub_name)
    ds = _to_src_tgt(splits[name], cfg, name)
    if len(ds) == 0:
        raise DataError(
            f"empty corpus: split {name!r} of {cfg.hub_name} has no rows; "
            "choose another split or dataset"
        )
    return ds


@contextmanager
def _quiet_hub_client() -> Iterator[None]:
    """Only errors from the Hub client's loggers while it loads: offline, `huggingface_hub`
    warns at each of its retries (on its own handler and again through the root logger), and
    the one line of a `DataError` says it all."""
    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "datasets")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _open_hub(cfg: DataConfig) -> datasets.DatasetDict:
    """All splits of ``hub_name``: a ``save_to_disk`` dir, a local data dir or a Hub dataset."""
    name = cfg.hub_name
    local = Path(name).expanduser()
    if (local / "dataset_dict.json").is_file() or (local / "state.json").is_file():
        loaded = datasets.load_from_disk(str(local))
        if isinstance(loaded, datasets.Dataset):
            return datasets.DatasetDict({"train": loaded})  # a single saved split
        return loaded
    hub_cache = str(cache_root(cfg) / "hub") if cfg.cache_dir else None
    fix = (
        "to use local files instead, set data.dir=PATH to a folder of <split>.<lang> files "
        f"(e.g. train.{cfg.src_lang}, train.{cfg.tgt_lang}, valid.{cfg.src_lang}, ...)"
    )
    try:
        with _quiet_hub_client():
            loaded = datasets.load_dataset(name, cfg.hub_config, cache_dir=hub_cache)
    except ConnectionError as e:
        raise DataError(f"cannot reach the Hugging Face Hub to load {name!r} ({e}); {fix}") from e
    except (datasets.exceptions.DatasetsError, OSError, ValueError) as e:
        raise DataError(
            f"cannot load dataset {name!r} (config {cfg.hub_config!r}): {e}; check "
            f"data.hub_name/data.hub_config, or {fix}"
        ) from e
    if not isinstance(loaded, datasets.DatasetDict):
        raise DataError(f"{name!r} did not load as a set of named splits; use data.dir instead")
    return loaded


def _resolve_split(split: str, available: list[str], source: str) -> str:
    for candidate in (split, *_SPLIT_ALIASES.get(split, ())):
        if candidate in available:
            return candidate
    raise DataError(
        f"split {split!r} not found in {source} (available splits: {', '.join(available)}); "
        "set data.train_split/data.valid_split/data.test_splits to existing splits, or map "
        "names with data.hub_splits"
    )


def _to_src_tgt(ds: datasets.Dataset, cfg: DataConfig, split: str) -> datasets.Dataset:
    """Map either Hub schema onto columns ``src``/``tgt`` without copying (Arrow-level ops)."""
    if "translation" in ds.column_names:
        feature = ds.features["translation"]
        langs = (
            list(feature.languages) if isinstance(feature, datasets.Translation) else list(feature)
        )
        where, prefix = "the translation column has languages", "translation."
        ds = ds.flatten()  # {"translation": {"de": .., "en": ..}} -> "translation.de", ...
    else:
        langs, where, prefix = list(ds.column_names), "the columns are", ""
    for lang in (cfg.src_lang, cfg.tgt_lang):
        if lang not in langs:
            raise DataError(
                f"language {lang!r} missing in split {split!r} of {cfg.hub_name}: {where} "
                f"{', '.join(map(str, langs))}; set data.src_lang/data.tgt_lang (or "
                "data.hub_config) to a pair that exists"
            )
    columns = {prefix + cfg.src_lang: "src", prefix + cfg.tgt_lang: "tgt"}
    return ds.select_columns(list(columns)).rename_columns(columns)


# --- cleaning and encoding --------------------------------------------------------------------


def filter_train_pairs(ds: datasets.Dataset, cfg: DataConfig) -> datasets.Dataset:
    """`filter_train_pairs_counted` without the counts."""
    return filter_train_pairs_counted(ds, cfg)[0]


def filter_train_pairs_counted(
    ds: datasets.Dataset, cfg: DataConfig
) -> tuple[datasets.Dataset, dict[str, int]]:
    """Drop pairs with an empty or whitespace-only side, then length-ratio outliers; the
    pairs kept and how many each rule dropped (``empty_side``, ``length_ratio``). For
    training data only (valid and test keep every line, so BLEU sees every reference).

    The ratio is on characters, ``(longer + 5) / (shorter + 5) > cfg.max_len_ratio``: unlike
    whitespace tokens it also works for unsegmented scripts, and the smoothing keeps short
    pairs. At the default 3.0 it removes about 0.01% of Multi30k or Tatoeba pairs.

    Each stage is cached on disk by ``datasets`` (written to a temp file, then renamed: never
    half a file).

    Raises:
        DataError: Nothing is left.
    """
    non_empty = _filter(ds, cfg, "empty", _keep_non_empty, {}, "dropping empty pairs")
    kept = _filter(
        non_empty,
        cfg,
        f"ratio {cfg.max_len_ratio}",
        _keep_ratio,
        {"max_ratio": cfg.max_len_ratio},
        "filtering length-ratio outliers",
    )
    counts = {"empty_side": len(ds) - len(non_empty), "length_ratio": len(non_empty) - len(kept)}
    removed = len(ds) - len(kept)
    log.info(
        "removed %d of %d training pairs: %d with an empty or whitespace-only side, %d with a "
        "length ratio > %g",
        removed,
        len(ds),
        counts["empty_side"],
        counts["length_ratio"],
        cfg.max_len_ratio,
    )
    if len(kept) == 0:
        raise DataError(
            f"no training pairs left after removing {removed} empty or misaligned pairs; "
            "check the corpus or raise data.max_len_ratio (0 disables the ratio filter)"
        )
    return kept, counts


def _filter(
    ds: datasets.Dataset, cfg: DataConfig, stage: str, keep, kwargs: dict, desc: str
) -> datasets.Dataset:
    key = _hash("filter", ds._fingerprint, stage)  # Dataset has no public accessor
    cache_file = cache_root(cfg) / "filtered" / f"{key}.arrow"
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    return ds.filter(
        keep,
        batched=True,
        input_columns=["src", "tgt"],
        fn_kwargs=kwargs,
        # An explicit file keeps the cache out of the corpus dir (load_from_disk datasets
        # would otherwise write next to their source files).
        cache_file_name=str(cache_file),
        load_from_cache_file=True,
        new_fingerprint=key,
        num_proc=_num_proc(cfg, len(ds)),
        desc=desc,
    )


def _keep_non_empty(srcs: list[str | None], tgts: list[str | None]) -> list[bool]:
    return [
        bool((s or "").strip()) and bool((t or "").strip()) for s, t in zip(srcs, tgts, strict=True)
    ]


def _keep_ratio(srcs: list[str], tgts: list[str], max_ratio: float) -> list[bool]:
    if max_ratio <= 0:
        return [True] * len(srcs)
    keep = []
    for src, tgt in zip(srcs, tgts, strict=True):
        n_src, n_tgt = len(src.strip()), len(tgt.strip())
        ratio = (max(n_src, n_tgt) + _RATIO_SMOOTHING) / (min(n_src, n_tgt) + _RATIO_SMOOTHING)
        keep.append(ratio <= max_ratio)
    return keep


def encode_split(
    ds: datasets.Dataset, tokenizer: Tokenizer, cfg: DataConfig, train: bool
) -> datasets.Dataset:
    """Add token ids (no specials) and their lengths; cached on disk and reused.

    The cache file is named from the tokenizer's model bytes, the dataset fingerprint and
    ``max_len``, so a changed corpus or tokenizer re-encodes and an unchanged one does not.

    Args:
        ds: Dataset with string columns ``src`` and ``tgt``.
        tokenizer: Encodes ``src`` with the source model and ``tgt`` with the target model.
        cfg: ``max_len``, ``num_proc`` and the cache location.
        train: Also drop pairs with more than ``cfg.max_len`` tokens on either side.

    Returns:
        Columns ``src``, ``tgt`` (raw text, the references), ``src_ids``, ``tgt_ids`` (int32
        lists) and ``src_len``, ``tgt_len`` (int32, for :class:`TokenBatchSampler` without
        reading every id list into Python).
    """
    max_len = cfg.max_len if train else None
    key = _hash("encode", tokenizer.fingerprint, ds._fingerprint, max_len)
    cache_file = cache_root(cfg) / "encoded" / f"{key}.arrow"
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    encoded = ds.map(
        _encode_batch,
        batched=True,
        input_columns=["src", "tgt"],
        # Rows can be dropped only when every input column is replaced by returned ones.
        remove_columns=ds.column_names,
        fn_kwargs={"tokenizer": tokenizer, "max_len": max_len},
        features=_ENCODED_FEATURES,
        cache_file_name=str(cache_file),
        load_from_cache_file=True,
        new_fingerprint=key,
        num_proc=_num_proc(cfg, len(ds)),
        desc="encoding",
    )
    if train:
        log.info(
            "removed %d of %d training pairs longer than max_len=%d tokens",
            len(ds) - len(encoded),
            len(ds),
            cfg.max_len,
        )
    return encoded


def _encode_batch(
    srcs: list[str], tgts: list[str], tokenizer: Tokenizer, max_len: int | None
) -> dict[str, list]:
    src_ids = tokenizer.encode_src(srcs)
    given = tokenizer.target_prefix()  # an imported NLLB model's target language token
    tgt_ids = [given + ids for ids in tokenizer.encode_tgt(tgts)]
    keep = [
        i
        for i in range(len(srcs))
        if max_len is None or (len(src_ids[i]) <= max_len and len(tgt_ids[i]) <= max_len)
    ]
    return {
        "src": [srcs[i] for i in keep],
        "tgt": [tgts[i] for i in keep],
        "src_ids": [src_ids[i] for i in keep],
        "tgt_ids": [tgt_ids[i] for i in keep],
        "src_len": [len(src_ids[i]) for i in keep],
        "tgt_len": [len(tgt_ids[i]) for i in keep],
    }
