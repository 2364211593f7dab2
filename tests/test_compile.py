"""`trainer.compile=true` on CPU (inductor): each layer kind (encoder, decoder) compiles to one
graph without graph breaks that every layer of its stack reuses, those graphs serve batches of
every (B, S, T) with B, S, T >= 2 with no recompile, a batch of one sentence adds one graph a
kind (0/1 specialisation), logits and gradients equal eager ones (dropout 0), and the model
itself stays eager. Then `train.py trainer.compile=true` end to end.

Slow: each cold inductor compile of forward + backward takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from attnmt.data.batching import Batch, collate
from attnmt.training.build import wrap_model
from attnmt.training.kernels import label_smoothed_cross_entropy
from tests.train_helpers import ROOT, toy, train_cmd

pytestmark = pytest.mark.slow

# Rows of the toy train split, as (first, count): 8 batches of 8 distinct shapes (B, S, T),
# B in 2..8, with S == T, S > T and S < T. The first has S == T, which duck sizing would tie
# into one symbol (and recompile at the next batch); `wrap_model` turns duck sizing off.
WINDOWS = [(8, 8), (0, 5), (5, 3), (16, 2), (18, 6), (24, 4), (28, 7), (35, 5)]
ONE_SENTENCE = (9, 1)  # B = 1, as an epoch's last batch can be: the one allowed recompile

# float32, compiled vs eager: inductor fuses and reorders reductions (softmax, LayerNorm,
# generated matmul epilogues), so results differ in the last bits, not bitwise. Seen on 2 CPU
# cores: logits up to 1.5e-6 absolute (|logits| < 6, i.e. ~3 ulp), gradients up to 1e-7
# (|grad| < 0.4). 1e-5 leaves a 7x margin; a real mistake (a mask, a slice) is off by far more.
RTOL, ATOL = 1e-5, 1e-5


def _batches(t, windows) -> list[Batch]:
    train, special = t.data.train, t.data.tokenizer.special
    out = []
    for first, count in windows:
        rows = train.select(range(first, first + count))
        out.append(collate(list(rows["src_ids"]), list(rows["tgt_ids"]), special))
    return out


def _loss_and_grads(model, batch: Batch, params) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Forward + the trainer's loss (per target token) + backward, as `train_step` does."""
    for p in params:
        p.grad = None
    logits = model(batch.src_ids, batch.tgt_in)  # (B, T, V)
    out = label_smoothed_cross_entropy(logits, batch.tgt_out, batch.pad_id, 0.1)
    (out.loss / batch.n_tgt_tokens).backward()
    return logits.detach(), [p.grad.clone() for p in params]


def _shape(batch: Batch) -> tuple[int, int, int]:
    return batch.src_ids.size(0), batch.src_ids.size(1), batch.tgt_in.size(1)  # B, S, T


def _check_equal(model, compiled, batch: Batch) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    eager_logits, eager_grads = _loss_and_grads(model, batch, params)
    logits, grads = _loss_and_grads(compiled, batch, params)
    shape = _shape(batch)
    torch.testing.assert_close(
        logits, eager_logits, rtol=RTOL, atol=ATOL, msg=lambda m: f"logits {shape}: {m}"
    )
    for name, grad, eager in zip(names, grads, eager_grads, strict=True):
        torch.testing.assert_close(
            grad, eager, rtol=RTOL, atol=ATOL, msg=lambda m, n=name: f"grad {n} {shape}: {m}"
        )


def test_compiled_layers_are_one_graph_a_kind_and_equal_eager(tmp_path):
    torch._dynamo.reset()
    counters.clear()
    t = toy(tmp_path, "model.dropout=0.0", "model.n_encoder_layers=2", "model.n_decoder_layers=2")
    model = t.trainee.model.train()
    compiled = wrap_model(model, t.ctx, compile=True)  # as `train` wraps it
    assert {id(p) for p in compiled.parameters()} == {id(p) for p in model.parameters()}
    assert not isinstance(model.decoder.layers[0], torch._dynamo.eval_frame.OptimizedModule)
    assert len(model.encoder.layers) >= 2 and len(model.decoder.layers) >= 2
    batches = _batches(t, WINDOWS)
    shapes = {_shape(b) for b in batches}
    assert len(shapes) == len(WINDOWS) >= 6 and min(min(s) for s in shapes) >= 2, shapes
    assert batches[0].src_ids.size(1) == batches[0].tgt_in.size(1)  # S == T first (duck sizing)
    for batch in batches:
        _check_equal(model, compiled, batch)
    assert dict(counters["graph_break"]) == {}
    # One frame a layer kind, compiled once for all its layers: no recompile over 8 shapes (a
    # recompile, or a layer that could not reuse its kind's graph, is another frame).
    assert counters["frames"]["ok"] == 2, dict(counters["frames"])
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])

    (one,) = _batches(t, [ONE_SENTENCE])
    assert one.src_ids.size(0) == 1
    _check_equal(model, compiled, one)
    _check_equal(model, compiled, batches[1])  # back to the first graphs, no fifth one
    assert dict(counters["graph_break"]) == {}
    assert counters["frames"]["ok"] == 4, dict(counters["frames"])
    assert counters["stats"]["unique_graphs"] == 4, dict(counters["stats"])


def test_train_py_with_compile_runs_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "TORCH_LOGS": "recompiles,graph_breaks"}
    cmd = train_cmd(
        run_dir,
        "trainer.compile=true",
        "trainer.max_steps=8",
        "trainer.eval_every=8",
        "trainer.log_every=4",
    )
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["steps"] == 8
    assert "test" in results["test"]
    log = proc.stdout + proc.stderr
    assert "[__graph_breaks]" not in log, log[-3000:]
    # Toy batches have B >= 2 and T >= 2 (checked above for one graph a layer kind); a batch
    # with B = 1 or T = 1 would add one graph a kind (0/1 specialisation): allow one such batch.
    recompiles = log.count("Recompiling function")
    assert recompiles <= 2, log[-3000:]
