"""Export a trained model to Hugging Face Transformers and to CTranslate2.

- `exporting.hf`: a `MarianMTModel` folder (weights permuted to fit its position table) and
  `generate` on our ids with our budgets.
- `exporting.ct2`: a `TransformerSpec` folder for `ctranslate2.Translator` and
  `translate_batch` on our ids with our budgets.
- `exporting.shared`: `ExportError`, optional imports, probe sentences, our output budgets.
- `exporting.folders`: the output folder, written beside the target and renamed when complete.

`scripts/export.py` is the command line; `scripts/export_check.py` compares the exports'
outputs with ours on a test set.
"""
