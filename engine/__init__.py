"""The inference engine beside the model: a trained `Transformer` decoding faster on the CPU
with the same outputs (`engine.engine`), its caches (`engine.cache`), greedy search with
continuous batching (`engine.continuous`), pre-packed and int8 linear layers (`engine.packed`,
`engine.int8`), and loading checkpoints for translation (`engine.load`)."""

from engine.engine import Engine
from engine.load import load_engine

__all__ = ["Engine", "load_engine"]
