"""Corpus loading (local folders and Hub schemas), clear errors, filtering and encode caching."""

from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from attnmt.data.dataset import DataConfig, encode_split, filter_train_pairs, load_split
from attnmt.data.errors import DataError
from attnmt.data.spm_train import TokenizerConfig, train_or_load_tokenizer
from attnmt.data.tokenizer import Tokenizer

GERMAN = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Die Frau trägt einen grünen Hut.",
    "Ein Junge isst ein Brötchen.",
    "Kinder überqueren die Straße.",
    "Der Hund schläft unter dem Tisch.",
    "Ein Mädchen lächelt fröhlich.",
    "Männer arbeiten auf einer Baustelle.",
    "Eine ältere Dame liest ein Buch.",
    "Zwei Frauen gehen am Strand spazieren.",
    "Ein Koch bereitet das Essen zu.",
    "Der Schüler übt Klavier.",
]
ENGLISH = [
    "A man rides a bike.",
    "Two dogs play in the snow.",
    "The woman wears a green hat.",
    "A boy eats a roll.",
    "Children cross the street.",
    "The dog sleeps under the table.",
    "A girl smiles happily.",
    "Men work on a construction site.",
    "An older lady reads a book.",
    "Two women walk on the beach.",
    "A cook prepares the food.",
    "The pupil practises the piano.",
]
ROOT = Path(__file__).resolve().parents[1]


def write_side(path: Path, lines: list[str], newline: str = "\n") -> None:
    write_raw(path, "".join(line + newline for line in lines).encode("utf-8"))


def write_raw(path: Path, payload: bytes) -> None:
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def write_split(folder: Path, split: str, de: list[str], en: list[str], gz: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    write_side(folder / f"{split}.de{suffix}", de)
    write_side(folder / f"{split}.en{suffix}", en)


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    write_split(folder, "train", GERMAN, ENGLISH)
    write_split(folder, "valid", GERMAN[:4], ENGLISH[:4])
    write_split(folder, "test2016", GERMAN[4:7], ENGLISH[4:7], gz=True)
    return folder


def config(tmp_path: Path, **kwargs: object) -> DataConfig:
    return DataConfig(cache_dir=str(tmp_path / "cache"), **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    train = datasets.Dataset.from_dict({"src": GERMAN, "tgt": ENGLISH})
    return train_or_load_tokenizer(
        train, TokenizerConfig(vocab_size=100), tmp_path_factory.mktemp("run")
    )


def rows(ds: datasets.Dataset) -> list[tuple[str, str]]:
    columns = ds[:]
    return list(zip(columns["src"], columns["tgt"], strict=True))


# --- local folders ----------------------------------------------------------------------------


def test_local_split_loads_raw_text_in_corpus_order(corpus_dir: Path, tmp_path: Path) -> None:
    ds = load_split(config(tmp_path, dir=str(corpus_dir)), "train")
    assert ds.column_names == ["src", "tgt"]
    assert rows(ds) == list(zip(GERMAN, ENGLISH, strict=True))
    # Memory-mapped from an Arrow file in the cache dir, never beside the corpus.
    assert Path(ds.cache_files[0]["filename"]).is_relative_to(tmp_path / "cache")


def test_direction_follows_src_and_tgt_lang(corpus_dir: Path, tmp_path: Path) -> None:
    ds = load_split(config(tmp_path, dir=str(corpus_dir), src_lang="en", tgt_lang="de"), "valid")
    assert rows(ds) == list(zip(ENGLISH[:4], GERMAN[:4], strict=True))


def test_gzipped_split_reads_like_plain_text(corpus_dir: Path, tmp_path: Path) -> None:
    ds = load_split(config(tmp_path, dir=str(corpus_dir)), "test2016")
    assert rows(ds) == list(zip(GERMAN[4:7], ENGLISH[4:7], strict=True))


def test_only_line_terminators_are_stripped(tmp_path: Path) -> None:
    folder = tmp_path / "crlf"
    folder.mkdir()
    write_side(folder / "train.de", ["  zwei  Leerzeichen ", "a\rb"], newline="\r\n")
    (folder / "train.en").write_bytes(b"\xef\xbb\xbftwo  spaces\ttab\nlast line without newline")
    ds = load_split(config(tmp_path, dir=str(folder)), "train")
    # A lone \r inside a line must not split it (text-mode universal newlines would); a
    # byte-order mark is dropped.
    assert rows(ds) == [
        ("  zwei  Leerzeichen ", "two  spaces\ttab"),
        ("a\rb", "last line without newline"),
    ]


def test_cache_is_reused_and_follows_file_changes(corpus_dir: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path, dir=str(corpus_dir))
    first = load_split(cfg, "valid")
    assert load_split(cfg, "valid").cache_files == first.cache_files
    write_split(corpus_dir, "valid", ["Neu hier."], ["New here."])
    changed = load_split(cfg, "valid")
    assert rows(changed) == [("Neu hier.", "New here.")]
    assert changed.cache_files != first.cache_files


def test_nothing_is_written_into_the_corpus_folder(
    corpus_dir: Path, tmp_path: Path, tokenizer: Tokenizer
) -> None:
    before = sorted(os.listdir(corpus_dir))
    cfg = config(tmp_path, dir=str(corpus_dir))
    train = filter_train_pairs(load_split(cfg, "train"), cfg)
    encode_split(train, tokenizer, cfg, train=True)
    encode_split(load_split(cfg, "valid"), tokenizer, cfg, train=False)
    assert sorted(os.listdir(corpus_dir)) == before


def test_default_cache_dir_respects_attnmt_cache(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNMT_CACHE", str(tmp_path / "env_cache"))
    ds = load_split(DataConfig(dir=str(corpus_dir)), "valid")
    assert Path(ds.cache_files[0]["filename"]).is_relative_to(tmp_path / "env_cache")


# --- errors -----------------------------------------------------------------------------------


def test_line_count_mismatch_names_both_files_and_counts(corpus_dir: Path, tmp_path: Path) -> None:
    write_side(corpus_dir / "train.en", ENGLISH[:9])
    with pytest.raises(DataError) as error:
        load_split(config(tmp_path, dir=str(corpus_dir)), "train")
    message = str(error.value)
    assert f"{corpus_dir / 'train.de'} has 12 lines" in message
    assert f"{corpus_dir / 'train.en'} has 9" in message
    assert "\n" not in message
    assert not list((tmp_path / "cache").rglob("*.tmp*"))  # no half-written cache left behind


def test_line_count_mismatch_when_source_is_shorter(corpus_dir: Path, tmp_path: Path) -> None:
    write_side(corpus_dir / "valid.de", GERMAN[:2])
    with pytest.raises(DataError, match=r"valid\.de has 2 lines but .*valid\.en has 4"):
        load_split(config(tmp_path, dir=str(corpus_dir)), "valid")


def test_missing_split_lists_the_available_splits(corpus_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError) as error:
        load_split(config(tmp_path, dir=str(corpus_dir)), "test2017")
    message = str(error.value)
    assert "'test2017' not found" in message
    assert "test2016 (de, en)" in message and "train (de, en)" in message
    assert "valid (de, en)" in message


def test_missing_language_names_the_languages_that_exist(corpus_dir: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path, dir=str(corpus_dir), src_lang="fr")
    with pytest.raises(DataError, match=r"language 'fr' missing .* has languages: de, en"):
        load_split(cfg, "train")


def test_empty_corpus_is_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    write_split(folder, "train", [], [])
    with pytest.raises(DataError, match="empty corpus"):
        load_split(config(tmp_path, dir=str(folder)), "train")


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path: Path, gz: bool) -> None:
    folder = tmp_path / "latin1"
    folder.mkdir()
    suffix = ".gz" if gz else ""
    write_side(folder / f"train.en{suffix}", ENGLISH[:4])
    bad = folder / f"train.de{suffix}"
    latin1 = "Grüße".encode("latin-1")  # b"Gr\xfc\xdfe": not UTF-8
    write_raw(bad, "".join(line + "\n" for line in GERMAN[:3]).encode("utf-8") + latin1)
    with pytest.raises(DataError, match=rf"{bad}: line 4 is not valid UTF-8"):
        load_split(config(tmp_path, dir=str(folder)), "train")


def test_corrupt_gzip_is_a_data_error(tmp_path: Path) -> None:
    folder = tmp_path / "corrupt"
    write_split(folder, "train", GERMAN, ENGLISH)
    (folder / "train.de").rename(folder / "train.de.gz")  # plain text named .gz
    with pytest.raises(DataError, match=r"cannot read .*train\.de\.gz"):
        load_split(config(tmp_path, dir=str(folder)), "train")


def test_no_corpus_configured_or_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data\.dir=PATH"):
        load_split(config(tmp_path), "train")
    with pytest.raises(DataError, match="is not a directory"):
        load_split(config(tmp_path, dir=str(tmp_path / "nope")), "train")


# --- Hub schemas ------------------------------------------------------------------------------


def hub_dict(schema: str) -> datasets.DatasetDict:
    """Splits train/validation in one of the two Hub schemas."""

    def split(de: list[str], en: list[str]) -> datasets.Dataset:
        if schema == "translation":  # wmt14, iwslt2017, opus_books
            return datasets.Dataset.from_dict(
                {"translation": [{"de": d, "en": e} for d, e in zip(de, en, strict=True)]}
            )
        return datasets.Dataset.from_dict({"en": en, "de": de})  # bentrevett/multi30k

    return datasets.DatasetDict(
        {"train": split(GERMAN, ENGLISH), "validation": split(GERMAN[:4], ENGLISH[:4])}
    )


@pytest.mark.parametrize("schema", ["translation", "flat"])
def test_hub_schemas_load_like_local_folders(schema: str, corpus_dir: Path, tmp_path: Path) -> None:
    saved = tmp_path / f"hub_{schema}"
    hub_dict(schema).save_to_disk(str(saved))
    hub = config(tmp_path, hub_name=str(saved))
    local = config(tmp_path, dir=str(corpus_dir))
    for split in ("train", "valid"):  # "valid" finds the Hub's "validation"
        assert rows(load_split(hub, split)) == rows(load_split(local, split))
        assert load_split(hub, split).column_names == ["src", "tgt"]
    reverse = config(tmp_path, hub_name=str(saved), src_lang="en", tgt_lang="de")
    assert rows(load_split(reverse, "validation"))[0] == (ENGLISH[0], GERMAN[0])


def test_hub_splits_maps_our_split_names_to_the_hubs(tmp_path: Path) -> None:
    saved = tmp_path / "hub"
    hub_dict("flat").save_to_disk(str(saved))
    cfg = config(tmp_path, hub_name=str(saved), hub_splits={"test2016": "validation"})
    assert rows(load_split(cfg, "test2016")) == list(zip(GERMAN[:4], ENGLISH[:4], strict=True))


def test_hub_data_files_in_json_lines(tmp_path: Path) -> None:
    folder = tmp_path / "jsonl"
    folder.mkdir()
    for split, n in (("train", 12), ("validation", 4)):
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for de, en in zip(GERMAN[:n], ENGLISH[:n], strict=True):
                f.write(json.dumps({"translation": {"de": de, "en": en}}, ensure_ascii=False))
                f.write("\n")
    ds = load_split(config(tmp_path, hub_name=str(folder)), "valid")
    assert rows(ds) == list(zip(GERMAN[:4], ENGLISH[:4], strict=True))


@pytest.mark.parametrize("schema", ["translation", "flat"])
def test_hub_missing_split_and_language(schema: str, tmp_path: Path) -> None:
    saved = tmp_path / "hub"
    hub_dict(schema).save_to_disk(str(saved))
    with pytest.raises(DataError, match=r"'test' not found .*available splits: train, validation"):
        load_split(config(tmp_path, hub_name=str(saved)), "test")
    with pytest.raises(DataError, match=r"language 'cs' missing .*en|de"):
        load_split(config(tmp_path, hub_name=str(saved), tgt_lang="cs"), "train")


def test_hub_unreachable_gives_one_line_with_the_local_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError(
            "Couldn't reach 'bentrevett/multi30k' on the Hub (LocalEntryNotFound)"
        )

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError) as error:
        load_split(config(tmp_path, hub_name="bentrevett/multi30k"), "train")
    message = str(error.value)
    assert "\n" not in message
    assert "bentrevett/multi30k" in message
    assert "data.dir=PATH" in message and "<split>.<lang>" in message


@pytest.mark.slow
def test_hub_offline_for_real_prints_one_line(tmp_path: Path) -> None:
    """The real ``datasets`` offline error (no network needed: HF_HUB_OFFLINE=1)."""
    code = (
        "from data.dataset import DataConfig, DataError, load_split\n"
        "try:\n"
        f"    load_split(DataConfig(hub_name='bentrevett/multi30k', cache_dir={str(tmp_path)!r}),"
        " 'train')\n"
        "except DataError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and "data.dir=PATH" in lines[0], result.stdout + result.stderr


# --- filtering --------------------------------------------------------------------------------


def test_training_filter_removes_empty_and_ratio_outliers_and_logs_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    de = [*GERMAN, "", "   ", "Hallo.", "Ja."]
    en = [*ENGLISH, "Empty source.", "Whitespace source.", "\t", "Yes. " * 20]
    folder = tmp_path / "noisy"
    write_split(folder, "train", de, en)
    write_split(folder, "valid", de, en)
    cfg = config(tmp_path, dir=str(folder))
    with caplog.at_level(logging.INFO, logger="attnmt.data.dataset"):
        train = filter_train_pairs(load_split(cfg, "train"), cfg)
    assert rows(train) == list(zip(GERMAN, ENGLISH, strict=True))
    assert "removed 4 of 16 training pairs" in caplog.text
    # Validation and test are never filtered: every line keeps its place for BLEU.
    assert len(load_split(cfg, "valid")) == 16


def test_short_pairs_are_not_ratio_outliers(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"src": ["In Ordnung.", "Ja"], "tgt": ["OK.", "Yes"]})
    assert len(filter_train_pairs(ds, config(tmp_path))) == 2


def test_ratio_filter_can_be_disabled(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"src": ["Ja."], "tgt": ["Yes. " * 20]})
    assert len(filter_train_pairs(ds, config(tmp_path, max_len_ratio=0))) == 1


def test_filtering_everything_is_an_error(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"src": ["", " "], "tgt": ["a", ""]})
    with pytest.raises(DataError, match="no training pairs left"):
        filter_train_pairs(ds, config(tmp_path))


# --- encoding ---------------------------------------------------------------------------------


def test_encode_adds_ids_and_keeps_raw_text(
    corpus_dir: Path, tmp_path: Path, tokenizer: Tokenizer
) -> None:
    cfg = config(tmp_path, dir=str(corpus_dir))
    encoded = encode_split(load_split(cfg, "valid"), tokenizer, cfg, train=False)
    columns = encoded[:]
    assert columns["src"] == GERMAN[:4] and columns["tgt"] == ENGLISH[:4]
    assert columns["src_ids"] == tokenizer.encode_src(GERMAN[:4])
    assert columns["tgt_ids"] == tokenizer.encode_tgt(ENGLISH[:4])
    assert columns["src_len"] == [len(ids) for ids in columns["src_ids"]]
    assert tokenizer.decode_tgt(columns["tgt_ids"]) == ENGLISH[:4]


def test_max_len_filters_training_only(
    corpus_dir: Path, tmp_path: Path, tokenizer: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    lengths = [
        max(len(s), len(t))
        for s, t in zip(tokenizer.encode_src(GERMAN), tokenizer.encode_tgt(ENGLISH), strict=True)
    ]
    max_len = sorted(lengths)[len(lengths) // 2]
    n_long = sum(length > max_len for length in lengths)
    assert 0 < n_long < len(GERMAN)  # the fixture must exercise the filter
    cfg = config(tmp_path, dir=str(corpus_dir), max_len=max_len)
    train = load_split(cfg, "train")
    with caplog.at_level(logging.INFO, logger="attnmt.data.dataset"):
        encoded = encode_split(train, tokenizer, cfg, train=True)
    assert len(encoded) == len(GERMAN) - n_long
    assert max(encoded[:]["src_len"] + encoded[:]["tgt_len"]) <= max_len
    assert f"removed {n_long} of 12 training pairs longer than max_len={max_len}" in caplog.text
    assert len(encode_split(train, tokenizer, cfg, train=False)) == len(GERMAN)


def test_encode_cache_is_reused(
    corpus_dir: Path, tmp_path: Path, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path, dir=str(corpus_dir))
    train = load_split(cfg, "train")
    first = encode_split(train, tokenizer, cfg, train=True)
    cache_files = list((tmp_path / "cache" / "encoded").glob("*.arrow"))
    assert [f["filename"] for f in first.cache_files] == [str(p) for p in cache_files]

    def fail(*args: object) -> None:
        raise AssertionError("re-encoded although corpus and tokenizer are unchanged")

    monkeypatch.setattr(type(tokenizer), "encode_src", fail)
    again = encode_split(load_split(cfg, "train"), tokenizer, cfg, train=True)
    assert again[:] == first[:]
    # Another max_len is another cache entry (which would need encoding).
    with pytest.raises(AssertionError, match="re-encoded"):
        encode_split(train, tokenizer, config(tmp_path, max_len=5), train=True)


def test_encode_with_two_processes_matches_one(
    corpus_dir: Path, tmp_path: Path, tokenizer: Tokenizer
) -> None:
    one = config(tmp_path / "one", dir=str(corpus_dir))
    two = config(tmp_path / "two", dir=str(corpus_dir), num_proc=2)
    expected = encode_split(load_split(one, "train"), tokenizer, one, train=True)[:]
    parallel = encode_split(load_split(two, "train"), tokenizer, two, train=True)
    assert len(parallel.cache_files) == 2  # one shard per process
    assert parallel[:] == expected


def test_num_proc_zero_means_every_core_for_big_splits_only(monkeypatch) -> None:
    from attnmt.data import dataset

    monkeypatch.setattr(dataset, "_cores", lambda: 8)
    auto = DataConfig(num_proc=0)
    assert dataset._num_proc(auto, 49_999) is None  # in-process
    assert dataset._num_proc(auto, 50_000) == 8
    assert dataset._num_proc(DataConfig(num_proc=3), 10) == 3  # explicit: as asked
    assert dataset._num_proc(DataConfig(num_proc=1), 10**6) is None
