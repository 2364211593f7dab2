"""A served model's languages, and the names `GET /languages` reports for their codes.

A checkpoint names its languages in one of two ways: an imported multilingual model carries a
top-level `"languages": {"source": [codes], "target": [codes]}` (its own codes: NLLB
`eng_Latn`, OPUS-MT `deu`); a model trained here has its run's `data.src_lang`/`data.tgt_lang`
in `ckpt["config"]`. `model_languages` reads both; the server routes with it. Torch-free.
"""

from __future__ import annotations

from typing import Any

# ISO 639-1 and 639-3 codes of common languages -> English names (LibreTranslate's `name`);
# a code not listed is reported as its own name.
NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan", "cs": "Czech",
    "da": "Danish", "de": "German", "el": "Greek", "en": "English", "es": "Spanish",
    "et": "Estonian", "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish",
    "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian", "it": "Italian",
    "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "nl": "Dutch",
    "no": "Norwegian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian",
    "sk": "Slovak", "sl": "Slovenian", "sv": "Swedish", "th": "Thai", "tr": "Turkish",
    "uk": "Ukrainian", "vi": "Vietnamese", "zh": "Chinese",
    "ara": "Arabic", "bul": "Bulgarian", "ces": "Czech", "dan": "Danish", "deu": "German",
    "ell": "Greek", "eng": "English", "est": "Estonian", "fin": "Finnish", "fra": "French",
    "heb": "Hebrew", "hin": "Hindi", "hun": "Hungarian", "ita": "Italian", "jpn": "Japanese",
    "kor": "Korean", "nld": "Dutch", "pol": "Polish", "por": "Portuguese", "ron": "Romanian",
    "rus": "Russian", "spa": "Spanish", "swe": "Swedish", "tur": "Turkish", "ukr": "Ukrainian",
    "zho": "Chinese",
}  # fmt: skip


def model_languages(ckpt: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(source codes, target codes) of a checkpoint dict: its `languages` when it has them,
    else its training config's `data.src_lang`/`data.tgt_lang`; ([], []) when it names none
    (such a model is reached by its id, or as the default model)."""
    declared = ckpt.get("languages")
    if isinstance(declared, dict) and (declared.get("source") or declared.get("target")):
        return [str(c) for c in declared.get("source") or []], [
            str(c) for c in declared.get("target") or []
        ]
    data = (ckpt.get("config") or {}).get("data") or {}
    src, tgt = data.get("src_lang"), data.get("tgt_lang")
    return ([str(src)] if src else []), ([str(tgt)] if tgt else [])


def is_multilingual(sources: list[str], targets: list[str]) -> bool:
    """Whether the model must be told the pair to translate (`Translator` methods'
    `src_lang=`/`tgt_lang=`): it has more than one source or target language."""
    return len(sources) > 1 or len(targets) > 1


def language_name(code: str) -> str:
    """`eng_Latn` -> English (NLLB codes by their language part); unknown codes as they are."""
    return NAMES.get(code) or NAMES.get(code.split("_")[0].split("-")[0]) or code
