"""The checkpoint format, below both training and decoding: save (atomic), safe load, and
building the model (`build_model`: fresh for training, or with a checkpoint's weights) and the
tokenizer a checkpoint holds (`checkpoint.format`)."""

from attnmt.checkpoint.format import (
    FORMAT_VERSION,
    CheckpointError,
    CheckpointWriteError,
    CorruptCheckpointError,
    InferenceBundle,
    build_model,
    keep_newest_step_checkpoints,
    load_checkpoint,
    load_for_inference,
    model_payload,
    payload_checksum,
    resolve_checkpoint,
    save_checkpoint,
    step_checkpoints,
    stored_model,
    stored_tokenizer,
)

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "InferenceBundle",
    "build_model",
    "keep_newest_step_checkpoints",
    "load_checkpoint",
    "load_for_inference",
    "model_payload",
    "payload_checksum",
    "resolve_checkpoint",
    "save_checkpoint",
    "step_checkpoints",
    "stored_model",
    "stored_tokenizer",
]
