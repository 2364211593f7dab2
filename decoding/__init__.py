"""Inference: greedy/beam search on a KV cache (`search`), ensembles of models (`ensemble`),
text in/out (`translator`), the decoding options (`config`, torch-free, so a command line checks
its flags before torch loads), teacher-forced scores (`scoring`), word alignment (`alignment`),
a reference decoder without a cache (`uncached`), input streaming (`inputs`) and attention
heatmaps (`plot`, matplotlib). Search runs anything with the model's protocol: the model
itself, or the inference engine beside it (`attnmt.engine.Engine`, what `translate.py` loads).
Import from the modules: `from attnmt.decoding.search import beam_search`.
"""
