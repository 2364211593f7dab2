"""Fine-tuning an imported NLLB-shaped model (the import tests' `nllb_folder`, imported by
import_hf.py) in bf16: ours (`training.loop.train_step`) against a plain Transformers loop on
the same batches in the same order; the first batch's NLL must agree (docs/benchmarks.md, "On a
GPU").

    python -m benchmarks.finetune --json finetune.json  # GPU: 12+12 layers x 1024, 4096 tokens
    python -m benchmarks.finetune --tiny --updates 20 --warmup 2 --batch-tokens 1024   # a CPU
"""

import argparse
import itertools
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnmt.common.errors import UserError
from attnmt.data.dataset import _encode_batch
from attnmt.training import build, distributed
from attnmt.training.init import initial_checkpoint
from attnmt.training.kernels import label_smoothed_cross_entropy
from attnmt.training.loop import _Window, train_step
from attnmt.training.run import Learner
from attnmt.training.state import seed_everything
from benchmarks import harness
from benchmarks.harness import cpu_model, version

LANGS = ("eng_Latn", "deu_Latn")
OURS, HF = "ours", "transformers"
NLL_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}  # relative, the mean NLL of the first batch
LOGIT_TOLERANCE = 1e-3  # fp32: max |logit difference| / the logits' std


def build_and_import(args: argparse.Namespace, tmp: Path, lines: list[str]) -> Path:
    """The Transformers folder, and our import of it (`import_hf.py` as users run it)."""
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    from tests.test_import_hf import NARROW, NLLB_600M, nllb_folder, transformers

    transformers.logging.disable_progress_bar()
    sizes = {**(NARROW if args.tiny else {k: NLLB_600M[k] for k in NARROW}),
             "encoder_layers": args.layers, "decoder_layers": args.layers}  # fmt: skip
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    folder = nllb_folder(tmp / "hf", lines, args.vocab, args.seed, sizes, decodable=False)
    args.seconds["spm + build + save"], started = time.perf_counter() - started, time.perf_counter()
    flags = ["--out", str(tmp / "run"), "--src-lang", LANGS[0], "--tgt-lang", LANGS[1]]
    import_hf = [sys.executable, harness.ROOT / "scripts" / "import_hf.py", folder, *flags]
    if subprocess.run(import_hf, cwd=harness.ROOT).returncode != 0:
        raise UserError("import_hf.py failed (its message is above)")
    args.seconds["import"] = time.perf_counter() - started
    return folder


def ours(args: argparse.Namespace, tmp: Path) -> tuple[Learner, Any]:
    """train.py's config with `trainer.init_from=` the import, the trainee built and loaded as
    `Run.start` does (without data), and the import's tokenizer for the pair. No weight average
    (the default experiment's `ema_decay`): the Transformers loop keeps none."""
    overrides = [f"trainer.init_from={tmp / 'run'}", f"trainer.precision={args.precision}",
                 f"trainer.device={args.device}", f"trainer.max_tokens={args.batch_tokens}",
                 f"tokenizer.src_lang={LANGS[0]}", f"tokenizer.tgt_lang={LANGS[1]}",
                 f"optim.warmup_steps={args.lr_warmup}", "trainer.ema_decay=0", "logger=none",
                 *args.set]  # fmt: skip
    cfg = harness.train_configs(overrides)
    ctx = distributed.setup(cfg.trainer.device, tf32=cfg.trainer.tf32)
    seed_everything(cfg.trainer.seed)
    initial = initial_checkpoint(cfg, tmp / "bench", set())
    trainee = build.build_trainee(cfg, initial.tokenizer, ctx.device)
    initial.load_into(trainee, keep_optimizer=False)
    seed_everything(cfg.trainer.seed + 1000 * ctx.rank)
    return Learner(cfg, ctx, trainee, trainee.model), initial.tokenizer  # = build.wrap_model


def batches(learner: Learner, tokenizer: Any, src: list[str], tgt: list[str], n: int) -> list:
    """`n` training batches as train.py makes them (epochs repeated as needed), on the device."""
    import datasets

    pairs = datasets.Dataset.from_dict(_encode_batch(src, tgt, tokenizer, learner.cfg.data.max_len))
    data = build.Data(tokenizer, pairs, pairs, {})
    iterator, made = build.train_batches(data, learner.cfg, learner.ctx), []
    for epoch in itertools.count():
        made += list(iterator.epoch(epoch))
        if len(made) >= n:
            return [b.to(learner.ctx.device) for b in made[:n]]
    raise AssertionError


def ours_step(learner: Learner) -> Any:
    window = _Window(learner.ctx.device)

    def step(batch: Any) -> torch.Tensor:  # the label-smoothed loss per target token
        train_step(learner, [batch], window)
        learner.trainee.state.step += 1
        loss = window.loss / batch.n_tgt_tokens  # a device tensor: no host read
        window.reset()
        return loss

    return step


def hf_step(model: Any, learner: Learner, bf16: bool) -> tuple[Any, torch.optim.Optimizer]:
    optim, device, vocab = learner.cfg.optim, learner.ctx.device, model.config.vocab_size
    adam = torch.optim.Adam(model.parameters(), betas=optim.betas, eps=optim.eps, fused=True)
    updates = itertools.count(1)

    def step(batch: Any) -> torch.Tensor:
        lr = build.learning_rate(next(updates), optim, model.config.d_model)  # ours' schedule
        for group in adam.param_groups:
            group["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=batch.src_ids, attention_mask=batch.src_mask,
                        decoder_input_ids=batch.tgt_in, use_cache=False)  # fmt: skip
        loss = F.cross_entropy(out.logits.float().view(-1, vocab), batch.tgt_out.view(-1),
                               ignore_index=batch.pad_id, label_smoothing=optim.label_smoothing,
                               reduction="sum") / batch.n_tgt_tokens  # fmt: skip
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip_norm)
        adam.step()
        adam.zero_grad(set_to_none=True)
        return loss.detach()

    return step, adam


def agreement(model: Any, hf: Any, batch: Any, precision: str) -> dict[str, Any]:
    """Both models' teacher-forced NLL per target token on `batch`, eval mode (fp32: no TF32)."""
    device, tf32 = batch.src_ids.device, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, precision == "bf16"):
        mine = model.eval()(batch.src_ids, batch.tgt_in).float()
        out = hf.eval()(input_ids=batch.src_ids, attention_mask=batch.src_mask,
                        decoder_input_ids=batch.tgt_in, use_cache=False)  # fmt: skip
    torch.backends.cuda.matmul.allow_tf32, theirs = tf32, out.logits.float()
    loss = lambda x: label_smoothed_cross_entropy(x, batch.tgt_out, batch.pad_id, 0.0)  # noqa: E731
    ours_nll, hf_nll = (loss(x).nll.item() / batch.n_tgt_tokens for x in (mine, theirs))
    real, rel = batch.tgt_out.ne(batch.pad_id), abs(ours_nll - hf_nll) / hf_nll
    logits = ((mine - theirs)[real].abs().max() / theirs[real].std()).item()
    passed = rel < NLL_TOLERANCE[precision] and (precision != "fp32" or logits < LOGIT_TOLERANCE)
    return {"ours": ours_nll, "transformers": hf_nll, "rel_diff": rel,
            "logit_err_over_std": logits, "passed": passed}  # fmt: skip


def state_bytes(model: torch.nn.Module, adam: torch.optim.Optimizer, extra: list = ()) -> int:
    """Weights, buffers, Adam's moments and `extra` (a weight average's copy), each counted once."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers(), *extra]}
    tensors |= {id(t): t for s in adam.state.values() for t in s.values() if torch.is_tensor(t)}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def mark(cuda: bool) -> Any:
    """A point in time: a CUDA event on the stream (no host wait), or the host clock."""
    if not cuda:
        return time.perf_counter()
    (event := torch.cuda.Event(enable_timing=True)).record()
    return event


def measure(steps: dict, made: list, args: argparse.Namespace, cuda: bool) -> dict:
    """Warm-up, then `args.rounds` rounds over the timed batches in the harness's rotating
    order; per system and round: seconds (synchronized), ms per update (CUDA events: no host
    waits), losses, and the largest allocation above what was allocated when it began."""
    res = {name: {"rounds": [], "ms": [], "losses": [], "transient": 0} for name in steps}
    for step, batch in itertools.product(steps.values(), made[: args.warmup]):
        step(batch)
    timed = made[args.warmup :]
    size = -(-len(timed) // args.rounds)

    def one_round(r: dict, step: Callable) -> None:
        part = timed[len(r["rounds"]) * size :][:size]
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        base, marks = torch.cuda.memory_allocated() if cuda else 0, [mark(cuda)]
        for batch in part:
            r["losses"].append(step(batch))
            marks.append(mark(cuda))
        if cuda:
            torch.cuda.synchronize()  # the events' times are read below
        r["ms"] += [a.elapsed_time(b) if cuda else 1e3 * (b - a) for a, b in itertools.pairwise(marks)]  # fmt: skip
        r["rounds"].append({"tokens": sum(b.n_src_tokens + b.n_tgt_tokens for b in part)})
        r["transient"] = max(r["transient"], torch.cuda.max_memory_allocated() - base if cuda else 0)  # fmt: skip

    runs = {name: (lambda r=res[name], step=step: one_round(r, step)) for name, step in steps.items()}  # fmt: skip
    times = harness.interleaved(runs, args.rounds, torch.cuda.synchronize if cuda else None)
    for name, r in res.items():
        r["losses"] = torch.stack(r["losses"]).tolist()
        for entry, seconds in zip(r["rounds"], times[name], strict=True):
            entry["seconds"] = seconds
    return res


def summarize(res: dict, states: dict, model: Any, timed: list, cuda: bool) -> dict:
    """Totals per system, and ours / transformers in tokens/s (overall and per round). Model
    FLOPs: 6 x (encoder parameters x source tokens + (decoder + output layer) x target tokens)."""
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    src, tgt = sum(b.n_src_tokens for b in timed), sum(b.n_tgt_tokens for b in timed)
    decoder = count(model.decoder) + count(model.generator)
    flops = 6.0 * (count(model.encoder) * src + decoder * tgt)
    for name, r in res.items():
        tokens, seconds = (sum(x[k] for x in r["rounds"]) for k in ("tokens", "seconds"))
        r.update(tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds,
                 ms_median=statistics.median(r["ms"]), state_bytes=states[name],
                 peak_bytes=states[name] + r.pop("transient") if cuda else None,
                 tflops=flops / seconds / 1e12, loss_first10=statistics.fmean(r["losses"][:10]),
                 loss_last10=statistics.fmean(r["losses"][-10:]))  # fmt: skip
    rate = lambda x: x["tokens"] / x["seconds"]  # noqa: E731
    rounds = zip(res[OURS]["rounds"], res[HF]["rounds"], strict=True)
    return {"ours/transformers": res[OURS]["tokens_per_s"] / res[HF]["tokens_per_s"],
            "per_round": [rate(a) / rate(b) for a, b in rounds]}  # fmt: skip


def print_head(m: dict, timed: list, check: dict) -> None:
    n, src, tgt = len(timed), sum(b.n_src_tokens for b in timed), sum(b.n_tgt_tokens for b in timed)
    slots = sum(b.src_ids.numel() + b.tgt_out.numel() for b in timed)
    print(f"NLLB-shaped, Transformers' init: d_model {m['d_model']}, {m['heads']} heads, FFN "
          f"{m['ffn']}, {m['layers']}+{m['layers']} layers, vocab {m['vocab']}, "
          f"{m['params'][OURS]:,} params; {m['precision']} on {m['device']}; torch {m['torch']}, "
          f"transformers {m['transformers']}; lr warmup {m['optim']['warmup_steps']}\n"
          "setup: " + ", ".join(f"{k} {v:.1f} s" for k, v in m["seconds"].items()) + "\n"
          f"batches: {m['pairs']} pairs of {m['src']}, {m['batch_tokens']} batch tokens: "
          f"{sum(map(len, timed)) / n:.0f} sentences and {src / n:.0f}+{tgt / n:.0f} src+tgt "
          f"tokens an update, padding {1 - (src + tgt) / slots:.1%}; {m['warmup']} warm-up + "
          f"{m['updates']} timed updates in {m['rounds']} rounds")  # fmt: skip
    for precision, c in check.items():
        print(f"check [{precision}] first batch, eval: NLL/token ours {c['ours']:.5f}, "
              f"transformers {c['transformers']:.5f}, rel diff {c['rel_diff']:.1e} "
              f"(< {NLL_TOLERANCE[precision]:g}), max |logit diff| / logit std "
              f"{c['logit_err_over_std']:.1e}: {'ok' if c['passed'] else 'FAILED'}")  # fmt: skip


def print_table(report: dict) -> None:
    head = ["system", "tokens/s", "ms/update", "TFLOP/s", "peak MiB", "state MiB", "loss first10", "last10"]  # fmt: skip
    rows = [[name, f"{r['tokens_per_s']:,.0f}", f"{r['ms_median']:.1f}", f"{r['tflops']:.3g}",
             "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:,.0f}",
             f"{r['state_bytes'] / 2**20:,.0f}", f"{r['loss_first10']:.3f}", f"{r['loss_last10']:.3f}"]
            for name, r in report["results"].items()]  # fmt: skip
    print("\n" + "\n".join(harness.table(head, rows)))
    ratio, rounds = report["ratio"], ", ".join(f"{x:.3f}" for x in report["ratio"]["per_round"])
    print(f"ratio ours/transformers (tokens/s): {ratio['ours/transformers']:.3f} "
          f"(per round: {rounds})")  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build, import, check, measure, print the table; returns the report."""
    started, args.seed = time.perf_counter(), args.seed or 0
    if version("transformers") is None:
        raise UserError("transformers is not installed (pip install -e '.[export]')")
    if not 1 <= args.rounds <= args.updates or args.warmup < 0:
        raise UserError("need 1 <= --rounds <= --updates and --warmup >= 0")
    from transformers import M2M100ForConditionalGeneration as M2M100

    cuda, args.seconds = args.device.startswith("cuda"), {}
    args.batch_tokens = args.batch_tokens or (4096 if cuda else 1024)
    args.layers = args.layers or (2 if args.tiny else 12)
    data = Path(os.environ.get("ATTNMT_DATA_DIR", harness.DATA.parent)) / "multi30k"
    data = data if (data / "train.en").is_file() else harness.ROOT / "tests" / "fixtures" / "toy"
    args.src, args.tgt = args.src or data / "train.en", args.tgt or data / "train.de"
    src, tgt = ([x.strip() for x in p.read_text("utf-8").splitlines()][: args.max_pairs or None]
                for p in (args.src, args.tgt))  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_and_import(args, Path(tmp), src + tgt)
        loading = time.perf_counter()
        learner, tokenizer = ours(args, Path(tmp))
        hf = M2M100.from_pretrained(folder, attn_implementation="sdpa", dtype=torch.float32)
        hf, model = hf.to(learner.ctx.device), learner.trainee.model
        args.seconds["load both"], loading = time.perf_counter() - loading, time.perf_counter()
        made = batches(learner, tokenizer, src, tgt, args.warmup + args.updates)
        args.seconds["batches"], cfg = time.perf_counter() - loading, learner.cfg.model
        precisions = dict.fromkeys(["fp32", args.precision])  # fp32 first: the exact check
        check = {p: agreement(model, hf, made[0], p) for p in precisions}
        meta = {"device": torch.cuda.get_device_name() if cuda else cpu_model(),
                "torch": torch.__version__, "transformers": version("transformers"),
                "python": platform.python_version(), "d_model": cfg.d_model, "heads": cfg.n_heads,
                "ffn": cfg.d_ff, "layers": args.layers, "vocab": cfg.tgt_vocab_size,
                "params": {OURS: model.num_parameters(), HF: hf.num_parameters()},
                "batch_tokens": args.batch_tokens, "updates": args.updates, "warmup": args.warmup,
                "rounds": args.rounds, "precision": args.precision, "attention": "sdpa",
                "init": "Transformers' own (nllb_folder decodable=False)", "pairs": len(src),
                "src": str(args.src), "tgt": str(args.tgt), "seconds": args.seconds,
                "model": asdict(cfg), "optim": asdict(learner.cfg.optim),
                "ema_decay": learner.cfg.trainer.ema_decay}  # fmt: skip
        print_head(meta, made[args.warmup :], check)
        if not all(c["passed"] for c in check.values()):
            raise UserError(f"ours and Transformers disagree on the first batch: {check}")
        step, adam = hf_step(hf.train(), learner, args.precision == "bf16")
        res = measure({OURS: ours_step(learner), HF: step}, made, args, cuda)
    ema = learner.trainee.ema  # None unless --set trainer.ema_decay=... turns it on
    states = {OURS: state_bytes(model, learner.trainee.optimizer, ema.shadow if ema else []),
              HF: state_bytes(hf, adam)}  # fmt: skip
    ratio = summarize(res, states, model, made[args.warmup :], cuda)
    report = {"meta": meta, "check": check, "results": res, "ratio": ratio}
    print_table(report)
    args.seconds["total"] = time.perf_counter() - started
    print(f"total {args.seconds['total']:.1f} s (after the imports)")
    return report


def add_flags(add: Callable) -> None:
    # fmt: off
    add("--tiny", action="store_true", help="the import tests' NARROW widths (64, 4 heads, 128)")
    add("--layers", type=int, default=None, help="a side (default: 12; --tiny 2)")
    add("--vocab", type=int, default=8000, help="SentencePiece pieces asked for (default 8000)")
    add("--src", type=Path, help="default: multi30k/train.en beside the repository, else the toy fixtures'")  # noqa: E501
    add("--tgt", type=Path, help="default: train.de beside it")
    add("--max-pairs", type=int, default=0, help="the first N pairs only (0: all)")
    add("--batch-tokens", type=int, default=None, help="trainer.max_tokens (GPU 4096, CPU 1024)")
    add("--updates", type=int, default=200, help="timed updates a system (default 200)")
    add("--warmup", type=int, default=10, help="untimed updates first (default 10)")
    add("--rounds", type=int, default=2, help="rounds of the timed updates (default 2)")
    add("--precision", choices=("bf16", "fp32"), default="bf16")
    add("--lr-warmup", type=int, default=100, help="optim.warmup_steps (train.py's 4000 keeps the lr near 0 here)")  # noqa: E501
    add("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py override for ours (the Transformers loop follows optim)")  # noqa: E501
    # fmt: on


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
