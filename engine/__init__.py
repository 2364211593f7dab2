"""The inference engine beside the model (`engine.engine`): greedy search with continuous
batching (`engine.continuous`) on its one-token decoder step and caches (`engine.cache`), int8
linear layers (`engine.int8`), and loading checkpoints for translation (`engine.load`)."""

from attnmt.engine.engine import Engine
from attnmt.engine.load import load_engine

__all__ = ["Engine", "load_engine"]
