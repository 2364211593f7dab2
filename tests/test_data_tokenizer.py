"""SentencePiece tokenizer: round-trip, special ids, resume, checkpoint state; training and its
cache (data/spm_train.py)."""

from __future__ import annotations

import io
import os
import pickle
import unicodedata
from pathlib import Path

import datasets
import pytest
import torch

from attnmt.data.dataset import DataConfig, load_split
from attnmt.data.errors import DataError
from attnmt.data.spm_tokenizer import SpmTokenizer
from attnmt.data.spm_train import TokenizerConfig, train_or_load_tokenizer
from attnmt.data.tokenizer import SpecialIds, Tokenizer
from attnmt.data.tokenizers import load_tokenizer
from attnmt.data.vocab_tokenizer import VocabTokenizer, Vocabulary

# (German, English, French, Czech): umlauts, accents and diacritics the models must keep.
SENTENCES = [
    ("Ein Mann fährt Fahrrad.", "A man rides a bike.", "Un homme fait du vélo.",
     "Muž jede na kole."),
    ("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow.",
     "Deux chiens jouent dans la neige.", "Dva psi si hrají ve sněhu."),
    ("Die Frau trägt einen grünen Hut.", "The woman wears a green hat.",
     "La femme porte un chapeau vert.", "Žena nosí zelený klobouk."),
    ("Ein Junge isst ein Brötchen.", "A boy eats a roll.", "Un garçon mange un petit pain.",
     "Chlapec jí rohlík."),
    ("Kinder überqueren die Straße.", "Children cross the street.",
     "Des enfants traversent la rue.", "Děti přecházejí ulici."),
    ("Der Hund schläft unter dem Tisch.", "The dog sleeps under the table.",
     "Le chien dort sous la table.", "Pes spí pod stolem."),
    ("Ein Mädchen lächelt fröhlich.", "A girl smiles happily.", "Une fille sourit gaiement.",
     "Dívka se vesele usmívá."),
    ("Männer arbeiten auf einer Baustelle.", "Men work on a construction site.",
     "Des hommes travaillent sur un chantier.", "Muži pracují na staveništi."),
    ("Eine ältere Dame liest ein Buch.", "An older lady reads a book.",
     "Une dame âgée lit un livre.", "Starší paní čte knihu."),
    ("Zwei Frauen gehen am Strand spazieren.", "Two women walk on the beach.",
     "Deux femmes se promènent sur la plage.", "Dvě ženy se procházejí po pláži."),
    ("Ein Koch bereitet das Essen zu.", "A cook prepares the food.",
     "Un cuisinier prépare le repas.", "Kuchař připravuje jídlo."),
    ("Der Schüler übt Klavier.", "The pupil practises the piano.",
     "L'élève s'exerce au piano.", "Žák cvičí na klavír."),
    ("Ein Vogel sitzt auf dem Baum.", "A bird sits in the tree.",
     "Un oiseau est perché sur l'arbre.", "Pták sedí na stromě."),
    ("Die Familie frühstückt gemeinsam.", "The family has breakfast together.",
     "La famille prend le petit-déjeuner ensemble.", "Rodina snídá společně."),
    ("Ein Radfahrer fährt über die Brücke.", "A cyclist rides over the bridge.",
     "Un cycliste traverse le pont.", "Cyklista jede přes most."),
    ("Mädchen tanzen auf der Bühne.", "Girls dance on the stage.",
     "Des filles dansent sur la scène.", "Dívky tančí na pódiu."),
    ("Ein Mann öffnet die Tür.", "A man opens the door.", "Un homme ouvre la porte.",
     "Muž otevírá dveře."),
    ("Die Katze spielt mit einem Ball.", "The cat plays with a ball.",
     "Le chat joue avec une balle.", "Kočka si hraje s míčem."),
    ("Ein Fußballspieler schießt ein Tor.", "A football player scores a goal.",
     "Un footballeur marque un but.", "Fotbalista střílí gól."),
    ("Große Wellen brechen am Ufer.", "Big waves break on the shore.",
     "De grandes vagues déferlent sur le rivage.", "Velké vlny se lámou o břeh."),
    ("Ein Kind malt ein Bild.", "A child paints a picture.", "Un enfant peint un tableau.",
     "Dítě maluje obrázek."),
    ("Zwei Männer trinken Kaffee.", "Two men drink coffee.", "Deux hommes boivent du café.",
     "Dva muži pijí kávu."),
    ("Der Zug fährt um acht Uhr ab.", "The train leaves at eight.",
     "Le train part à huit heures.", "Vlak odjíždí v osm hodin."),
    ("Ein Fischer zieht sein Netz ein.", "A fisherman pulls in his net.",
     "Un pêcheur remonte son filet.", "Rybář vytahuje síť."),
]  # fmt: skip


def pairs_dataset(rows: list[tuple[str, str]]) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"src": [s for s, _ in rows], "tgt": [t for _, t in rows]})


@pytest.fixture(scope="session")
def corpus() -> datasets.Dataset:
    """Sources German and French, targets English and Czech: every script feature trains."""
    rows = [(de, en) for de, en, _, _ in SENTENCES] + [(fr, cs) for _, _, fr, cs in SENTENCES]
    return pairs_dataset(rows)


@pytest.fixture(scope="session")
def joint_dir(tmp_path_factory: pytest.TempPathFactory, corpus: datasets.Dataset) -> Path:
    run_dir = tmp_path_factory.mktemp("spm_joint")
    train_or_load_tokenizer(corpus, TokenizerConfig(vocab_size=150), run_dir)
    return run_dir


@pytest.fixture(scope="session")
def joint(joint_dir: Path) -> Tokenizer:
    return train_or_load_tokenizer(pairs_dataset([]), TokenizerConfig(vocab_size=150), joint_dir)


CUSTOM = TokenizerConfig(
    vocab_size=120, model_type="bpe", joint=False, pad_id=3, unk_id=2, bos_id=0, eos_id=1
)


@pytest.fixture(scope="session")
def separate_dir(tmp_path_factory: pytest.TempPathFactory, corpus: datasets.Dataset) -> Path:
    run_dir = tmp_path_factory.mktemp("spm_separate")
    train_or_load_tokenizer(corpus, CUSTOM, run_dir)
    return run_dir


@pytest.fixture(scope="session")
def separate(separate_dir: Path) -> Tokenizer:
    return train_or_load_tokenizer(pairs_dataset([]), CUSTOM, separate_dir)


@pytest.fixture(scope="session")
def imported(joint: Tokenizer) -> VocabTokenizer:
    """An imported model's tokenizer as scripts/import_hf.py builds one: the joint model's
    pieces numbered backwards after two language tokens (OPUS-MT's ``>>deu<<``)."""
    src = [">>deu<<", ">>fra<<", *reversed(joint.src_pieces(range(joint.src_vocab_size)))]
    pad, unk, bos, eos = (src.index(p) for p in ("<pad>", "<unk>", "<s>", "</s>"))
    vocab = Vocabulary(src, src, SpecialIds(pad, unk, bos, eos), {"deu": 0, "fra": 1})
    return VocabTokenizer(joint.state_dict()["src_model"], None, vocab)


def all_texts() -> list[str]:
    return [text for row in SENTENCES for text in row]


def test_round_trip_keeps_umlauts_accents_and_diacritics(joint: Tokenizer) -> None:
    texts = all_texts()
    assert joint.decode_tgt(joint.encode_tgt(texts)) == texts
    assert joint.decode_src(joint.encode_src(texts)) == texts


def test_encoding_adds_no_specials_and_never_unk_on_training_text(joint: Tokenizer) -> None:
    ids = joint.encode_src(all_texts())
    specials = {joint.special.pad, joint.special.bos, joint.special.eos, joint.special.unk}
    assert all(len(seq) > 0 for seq in ids)
    assert not specials & {i for seq in ids for i in seq}


def test_decode_stops_at_first_eos_and_drops_pad_and_bos(joint: Tokenizer) -> None:
    sp = joint.special
    ids = joint.encode_tgt(["Two dogs play in the snow."])[0]
    junk = joint.encode_tgt(["A man rides a bike."])[0]
    hyp = [sp.bos, *ids, sp.eos, *junk, sp.pad, sp.pad]
    assert joint.decode_tgt([hyp, [sp.bos, sp.eos], []]) == ["Two dogs play in the snow.", "", ""]


def test_default_special_ids_are_pad0_unk1_bos2_eos3(joint: Tokenizer) -> None:
    assert joint.special == SpecialIds(pad=0, unk=1, bos=2, eos=3)
    assert joint.src_pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert joint.joint and joint.src_vocab_size == joint.tgt_vocab_size == 150


def test_custom_special_ids_separate_bpe_models(separate: Tokenizer, separate_dir: Path) -> None:
    assert separate.special == SpecialIds(pad=3, unk=2, bos=0, eos=1)
    assert separate.src_pieces([3, 2, 0, 1]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert separate.tgt_pieces([3, 2, 0, 1]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert not separate.joint
    assert sorted(p.name for p in separate_dir.glob("*.model")) == [
        "spm.src.model",
        "spm.tgt.model",
    ]
    targets = [en for _, en, _, _ in SENTENCES] + [cs for _, _, _, cs in SENTENCES]
    assert separate.decode_tgt(separate.encode_tgt(targets)) == targets
    # The source model never saw English, so its pieces differ from the target model's.
    assert separate.encode_src(["The dog."]) != separate.encode_tgt(["The dog."])


def test_pieces_spell_the_sentence(joint: Tokenizer) -> None:
    text = "Ein Mädchen lächelt fröhlich."
    pieces = joint.src_pieces(joint.encode_src([text])[0])
    assert "".join(pieces).replace("\u2581", " ").strip() == text


def test_saved_model_is_reused_on_resume(joint_dir: Path, joint: Tokenizer) -> None:
    model = joint_dir / "spm.model"
    before = model.stat().st_mtime_ns
    # An empty corpus would make training fail, so success proves the saved model was used.
    again = train_or_load_tokenizer(pairs_dataset([]), TokenizerConfig(vocab_size=150), joint_dir)
    assert again.state_dict() == joint.state_dict()
    assert model.stat().st_mtime_ns == before
    assert (joint_dir / "spm.vocab").read_text(encoding="utf-8").startswith("<pad>\t")


def test_resume_with_different_special_ids_fails_clearly(joint_dir: Path) -> None:
    cfg = TokenizerConfig(vocab_size=150, pad_id=1, unk_id=0)
    with pytest.raises(DataError, match=r"special ids pad=0 unk=1 .* asks for pad=1 unk=0"):
        train_or_load_tokenizer(pairs_dataset([]), cfg, joint_dir)


def test_resume_with_other_joint_setting_fails_clearly(joint_dir: Path) -> None:
    cfg = TokenizerConfig(vocab_size=150, joint=False)
    with pytest.raises(DataError, match=r"spm\.model.*tokenizer\.joint=False"):
        train_or_load_tokenizer(pairs_dataset([]), cfg, joint_dir)


@pytest.mark.parametrize("fixture", ["joint", "separate", "imported"])
def test_state_dict_survives_torch_save_and_weights_only_load(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    tokenizer: Tokenizer = request.getfixturevalue(fixture)
    buffer = io.BytesIO()
    torch.save({"tokenizer": tokenizer.state_dict()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["tokenizer"]
    restored = load_tokenizer(state)
    texts = all_texts()
    assert restored.encode_src(texts) == tokenizer.encode_src(texts)
    assert restored.encode_tgt(texts) == tokenizer.encode_tgt(texts)
    assert restored.special == tokenizer.special and restored.joint == tokenizer.joint
    assert type(restored) is type(tokenizer) and restored.state_dict() == tokenizer.state_dict()
    unpickled = pickle.loads(pickle.dumps(tokenizer))
    assert type(unpickled) is type(tokenizer) and unpickled.fingerprint == tokenizer.fingerprint


def test_state_layout_is_what_checkpoints_hold(
    joint: Tokenizer, separate: Tokenizer, imported: VocabTokenizer
) -> None:
    """Checkpoints written before load: the state's keys and versions never change."""
    keys = {"format", "version", "joint", "src_model"}
    assert joint.state_dict().keys() == keys
    assert separate.state_dict().keys() == keys | {"tgt_model"}
    assert imported.state_dict().keys() == keys | {"vocab"}
    versions = [t.state_dict()["version"] for t in (joint, separate, imported)]
    assert joint.state_dict()["format"] == "attnmt.sentencepiece" and versions == [1, 1, 2]


def test_an_imported_vocabulary_numbers_the_pieces(
    joint: Tokenizer, imported: VocabTokenizer
) -> None:
    texts, n = all_texts(), imported.src_vocab_size
    assert imported.encode_tgt(texts) == [
        [n - 1 - i for i in ids] for ids in joint.encode_tgt(texts)
    ]
    assert imported.decode_tgt(imported.encode_tgt(texts)) == texts
    assert imported.languages == ["deu", "fra"] and imported.fingerprint != joint.fingerprint
    to_french = imported.for_languages(None, "fra")
    assert to_french.source_prefix() == [1] and to_french.encode_src(["A man."])[0][0] == 1
    assert imported.encode_src([">>deu<< A man."]) == [[0, *imported.encode_tgt(["A man."])[0]]]
    with pytest.raises(DataError, match="unknown target language 'xyz'"):
        imported.for_languages(None, "xyz")
    with pytest.raises(DataError, match="no language codes"):
        joint.for_languages(None, "fra")


def test_incompatible_state_dict_is_a_data_error() -> None:
    with pytest.raises(DataError, match="incompatible version"):
        load_tokenizer({"format": "something-else", "version": 7})


def test_save_writes_model_files(joint: Tokenizer, tmp_path: Path) -> None:
    joint.save(tmp_path)
    assert SpmTokenizer((tmp_path / "spm.model").read_bytes()).fingerprint == joint.fingerprint


def test_training_samples_input_sentence_size_sentences(
    corpus: datasets.Dataset, tmp_path: Path
) -> None:
    bigger = datasets.concatenate_datasets([corpus] * 4)  # 384 sentences, 202 sampled
    cfg = TokenizerConfig(vocab_size=80, input_sentence_size=101)
    tokenizer = train_or_load_tokenizer(bigger, cfg, tmp_path)
    assert tokenizer.src_vocab_size == 80


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model_type": "word"}, "model_type"),
        ({"pad_id": 1}, "distinct"),
        ({"eos_id": 9000}, "distinct"),
        ({"input_sentence_size": 50}, "input_sentence_size"),
    ],
)
def test_invalid_config_is_a_data_error(kwargs: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        TokenizerConfig(**kwargs)


def test_vocab_too_large_for_corpus_is_a_data_error(
    corpus: datasets.Dataset, tmp_path: Path
) -> None:
    with pytest.raises(DataError, match="vocab_size"):
        train_or_load_tokenizer(corpus, TokenizerConfig(vocab_size=50_000), tmp_path)
    assert not list(tmp_path.glob("*.model"))


def test_encode_rejects_a_bare_string(joint: Tokenizer) -> None:
    with pytest.raises(TypeError):
        joint.encode_src("Ein Mann.")  # type: ignore[arg-type]


@pytest.mark.corpus
@pytest.mark.parametrize(("src_lang", "tgt_lang"), [("de", "en"), ("fr", "cs")])
def test_round_trip_on_real_multi30k(src_lang: str, tgt_lang: str, tmp_path: Path) -> None:
    root = os.environ.get("ATTNMT_DATA_DIR")
    if not root:
        pytest.skip("set ATTNMT_DATA_DIR to the shared data folder to run corpus tests")
    cfg = DataConfig(
        dir=str(Path(root) / "multi30k"),
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        cache_dir=str(tmp_path / "cache"),
    )
    valid = load_split(cfg, "valid")
    tokenizer = train_or_load_tokenizer(valid, TokenizerConfig(vocab_size=1000), tmp_path)
    columns = valid[:]
    for texts in (columns["src"], columns["tgt"]):
        # SentencePiece applies NFKC and collapses runs of spaces (nmt_nfkc normalization).
        expected = [unicodedata.normalize("NFKC", " ".join(t.split())) for t in texts]
        assert tokenizer.decode_tgt(tokenizer.encode_tgt(texts)) == expected
    assert any(ch in "".join(columns["src"] + columns["tgt"]) for ch in "äöüéèřčšž")


def test_a_prepared_model_is_reused_by_a_new_run_dir_and_retrained_when_settings_change(
    corpus: datasets.Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Prepare once, train many times: a new run dir gets the cached model's exact bytes; a
    different vocab size or corpus trains a new one."""
    import attnmt.data.spm_train as tok

    cache, cfg = tmp_path / "cache", TokenizerConfig(vocab_size=150)
    first = train_or_load_tokenizer(corpus, cfg, tmp_path / "run1", cache)
    trained = []
    real_train = tok._train_model
    monkeypatch.setattr(tok, "_train_model", lambda *a: trained.append(a) or real_train(*a))

    again = train_or_load_tokenizer(corpus, cfg, tmp_path / "run2", cache)
    assert not trained
    assert (tmp_path / "run2" / "spm.model").read_bytes() == first.state_dict()["src_model"]
    assert again.encode_src(["Ein Mann fährt Fahrrad."]) == first.encode_src(
        ["Ein Mann fährt Fahrrad."]
    )

    train_or_load_tokenizer(corpus, TokenizerConfig(vocab_size=140), tmp_path / "run3", cache)
    assert len(trained) == 1
    smaller = corpus.select(range(len(corpus) - 1))
    train_or_load_tokenizer(smaller, cfg, tmp_path / "run4", cache)
    assert len(trained) == 2
