"""Export a trained checkpoint to Transformers (MarianMTModel) and CTranslate2 (`convert`)."""
