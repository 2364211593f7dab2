"""The inference engine: a trained `Transformer`, with the speed paths that earn their place on
real sentences beside the model's own code.

Legend: B sentences, N = B * K decoder rows (K per sentence), S src len, T tgt len, D d_model,
H heads, Dh head dim, V vocab.

`Engine(model)` implements the protocol `decoding.search` runs (`encode`, `decode` one new token
per row on its caches, `new_caches`), so greedy, beam and ensemble search run it as they run
the model, and adds:
- greedy search with continuous batching (`engine.continuous`, `greedy_search_continuous`): a
  row freed by a finished sentence takes the next one at once. Its rows are at different
  positions, which the model's layers cannot run, so it runs `decoder_step`: one token per
  row, 2-D rows, the heads folded into the batch of `bmm`, each row's own past and source
  masked by score biases added inside the matmul (`baddbmm`);
- with `quantize="int8"`, int8 linear layers (`engine.int8`): the encoder and `decoder_step`
  on copies of the model's linear layers, quantized;
- on the CPU, linear layers on oneDNN's pre-packed weights (`PackedLinear`, what Inductor's
  freezing gives a linear layer with a dynamic row count), in the groups that timing them here
  chose (`engine.packing`): the output projection, the decoder's layers (then every search runs
  `decoder_step` on them), the encoder's, and under bf16 autocast every layer's bf16 copy
  (autocast casts each weight at every call otherwise). The engine packs copies of the weights
  when it is built: build a new engine after the weights change (validation does, each time).
Otherwise, in float32, `encode` and `decode` are the model's layers, on its `KVCache`.

A path stays only where timing it against the same decoder without it on real sentences
shows it paying (docs/benchmarks.md, "The engine, path by path"; whole searches against peers: `python -m benchmarks.benchmark --run R
--cpu-kinds native,avx2`); a prototype of the decoder step compiled by Inductor did not pay
either (docs/benchmarks.md, "Compiling the decoder step does not pay here"). The contract with
the model is tested (tests/test_engine.py): the same logits up to float rounding, the same hypotheses.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnmt.decoding.config import SearchConfig
from attnmt.decoding.search import Hypothesis, SpecialTokens
from attnmt.engine.cache import StepCache, StepKVCache
from attnmt.engine.continuous import continuous_greedy_search
from attnmt.engine.int8 import quantize_linears
from attnmt.engine.packing import Packing, bf16_packing_runs, choose
from attnmt.model.attention import attention, padding_mask, split_heads
from attnmt.model.layers import rows_per_sentence
from attnmt.model.transformer import AttentionMaps, Transformer


class Rows(nn.Module):
    """Rows `start:end` of a linear layer's outputs (a slice of a fused projection), on the
    layer's own parameters."""

    def __init__(self, linear: nn.Linear, start: int, end: int) -> None:
        super().__init__()
        self.linear, self.start, self.end = linear, start, end

    @property
    def weight(self) -> Tensor:
        return self.linear.weight[self.start : self.end]

    @property
    def bias(self) -> Tensor:
        return self.linear.bias[self.start : self.end]

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class Engine(nn.Module):
    """A trained Transformer for search, with continuous batching and int8 (module docstring).

    Args:
        model: the trained model, on the device the engine runs on. It is not changed; the
            engine uses its parameters (int8 quantizes copies of them).
        quantize: "none" or "int8" (dynamic int8 linear layers, CPU only).
        pack: on the CPU only, which linear layers run on oneDNN's packed weights: a
            `Packing`, True (every group), False (none), or None: the groups that paid when
            timed on this CPU for this model's shapes (`engine.packing.choose`, remembered in
            the user cache, or `pack_cache`). A search runs the engine's one-token step on packed decoder
            layers; bf16 copies (under bf16 autocast, where oneDNN has bf16 on this CPU) take
            half the float32 weights' memory again.

    Decoding runs as in eval mode (no dropout), whatever the model's mode.

    Example:
        >>> engine = Engine(model)
        >>> beam_search(engine, src_ids, tokenizer.special, SearchConfig(beam_size=5))
    """

    def __init__(
        self,
        model: Transformer,
        quantize: str = "none",
        pack: bool | Packing | None = None,
        pack_cache: Path | None = None,
    ) -> None:
        super().__init__()
        if quantize not in ("none", "int8"):
            raise ValueError(f"quantize must be 'none' or 'int8', got {quantize!r}")
        device = next(model.parameters()).device
        if quantize == "int8" and device.type != "cpu":
            raise ValueError(
                f"int8 dynamic quantization runs on the CPU only, the model is on {device}"
            )
        if isinstance(pack, bool):
            pack = Packing(*[pack] * 4)
        if pack is None:  # what pays here, timed (`engine.packing`)
            cpu = quantize == "none" and device.type == "cpu"
            cfg = model.cfg
            shape = (cfg.d_model, cfg.d_ff, cfg.tgt_vocab_size)
            pack = choose(*shape, cache=pack_cache) if cpu else Packing()
        if pack != Packing() and (quantize != "none" or device.type != "cpu"):
            raise ValueError("pack packs CPU layers: not with int8 or on another device")
        self.model = model
        self.cfg = model.cfg  # the model's shape, as `Transformer.cfg`
        self.packing = pack
        self.int8 = quantize == "int8"
        # every linear layer on a bf16 copy under bf16 autocast, where oneDNN has bf16 here
        self.pack_bf16 = pack.bf16 and bf16_packing_runs()
        self.pack_decoder, self.pack_encoder = pack.decoder, pack.encoder
        # int8 scales activations per batch: a row's output would depend on the rows beside it
        self.continuous_batching = not self.int8  # see `decoding.search.ContinuousGreedy`
        prepare = _copy if self.int8 else _shared

        def packed(fp32: bool) -> Prepare:
            if not (fp32 or self.pack_bf16):
                return prepare
            return partial(PackedLinear, fp32=fp32, bf16=self.pack_bf16)

        self.encoder_linears = nn.ModuleList(  # int8's and the packed encoder (else the model's)
            _encoder_linears(layer, packed(pack.encoder)) for layer in model.encoder.layers
        )
        self.decoder_linears = nn.ModuleList(
            _decoder_linears(layer, packed(pack.decoder)) for layer in model.decoder.layers
        )
        self.generator = packed(pack.generator)(model.generator)
        if self.int8:
            linears = nn.ModuleList([self.encoder_linears, self.decoder_linears, self.generator])
            quantize_linears(linears)  # swaps the layers inside these containers
            self.generator = linears[2]
        self.train(model.training)

    # ----------------------------------------------------------------- the search protocol

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """(B, S) ids -> memory (B, S, D): the model's, on int8 layers with int8 and on the
        bf16 copies under bf16 autocast (`bf16_packed`)."""
        if src_mask is None:
            src_mask = padding_mask(src_ids, self.model.cfg.pad_id)
        if not (self.int8 or self.bf16_packed or self.fp32_encoder_packed):
            return self.model.encode(src_ids, src_mask)
        x = self.model.embed_source(src_ids)  # (B, S, D)
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for layer, linears in zip(self.model.encoder.layers, self.encoder_linears, strict=True):
            x = self._encoder_layer(layer, linears, x, mask)
        return self.model.encoder.final_norm(x)

    def decode(
        self,
        tgt_ids: Tensor,  # (N, T); with caches T = 1, the token at position `offset`
        memory: Tensor,  # (B, S, D)
        src_mask: Tensor,  # (B, S) bool
        caches: list[StepKVCache] | None = None,
        offset: int = 0,
    ) -> Tensor:
        """Logits (N, T, V) for the next token. With the engine's own caches (`new_caches` of an
        engine on its own decoder layers, `own_decoder`) `step`, one new token per row: the
        caches decide, since under bf16 autocast `own_decoder` is the calling thread's state;
        otherwise the model's `decode`, its output projection the engine's."""
        if caches and isinstance(caches[0], StepKVCache):
            return self.step(tgt_ids, memory, src_mask, caches, offset)
        if self.int8:
            return self.model.decode(tgt_ids, memory, src_mask)
        x = self.model.embed_target(tgt_ids, offset)  # (N, T, D): `Transformer.decode`'s layers
        hidden = self.model.decoder(x, memory, src_mask[:, None, None, :], caches).hidden
        return self.generator(hidden)

    @property
    def packed(self) -> bool:
        """Whether the float32 output projection runs on oneDNN's packed weight."""
        return isinstance(self.generator, PackedLinear) and self.generator.packed is not None

    @property
    def fp32_encoder_packed(self) -> bool:
        """Whether the encoder runs on its packed float32 copies now (outside autocast)."""
        return self.pack_encoder and not torch.is_autocast_enabled("cpu")

    @property
    def bf16_packed(self) -> bool:
        """Whether the linear layers run on their bf16 copies now: packed, under bf16 autocast
        (a per-thread state, so asked at each call)."""
        return self.pack_bf16 and bf16_autocast()

    @property
    def own_decoder(self) -> bool:
        """Whether searches run `step` on the engine's decoder layers (int8, packed, or on bf16
        copies) rather than the model's `DecoderLayer.forward`."""
        return self.int8 or self.pack_decoder or self.bf16_packed

    def step(
        self,
        tgt_ids: Tensor,  # (N, 1): the token at position `offset`
        memory: Tensor,  # (B, S, D)
        src_mask: Tensor,  # (B, S) bool
        caches: list[StepKVCache],
        offset: int,
    ) -> Tensor:
        """`decode` of one new token per row by `decoder_step`: logits (N, 1, V)."""
        if tgt_ids.size(1) != 1:
            raise ValueError("the engine's step decodes one new token per row (T = 1)")
        x = self.model.embed_target(tgt_ids, offset).squeeze(1)  # (N, D)
        return self.generator(self.decoder_step(x, memory, src_mask, caches)).unsqueeze(1)

    def new_caches(self) -> list:
        """Empty caches, one per decoder layer: `StepKVCache`s for `step` (`own_decoder`),
        else the model's."""
        if not self.own_decoder:
            return self.model.new_caches()
        return [StepKVCache() for _ in self.decoder_linears]

    def attention_maps(self, src_ids: Tensor, tgt_in: Tensor) -> AttentionMaps:
        """The model's attention weights (its explicit path), for heatmaps."""
        return self.model.attention_maps(src_ids, tgt_in)

    def greedy_search_continuous(
        self,
        src_ids: list[list[int]],
        special: SpecialTokens,
        cfg: SearchConfig,
        progress: Callable[[int], object] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[list[Hypothesis]]:
        """Greedy search with continuous batching (`engine.continuous`) on this engine;
        `stop` as `search.greedy_search`'s."""
        return continuous_greedy_search(self, src_ids, special, cfg, progress, stop)

    # ---------------------------------------------------------------------------- encoder

    def _encoder_layer(
        self, layer: nn.Module, linears: nn.ModuleDict, x: Tensor, mask: Tensor
    ) -> Tensor:
        """`EncoderLayer.forward` at inference: x (B, S, D), mask (B, 1, 1, S)."""
        norms = layer.norms
        h = norms[0](x) if self.cfg.norm_first else x
        q, k, v = split_heads(linears["qkv"](h), 3, self.cfg.n_heads)  # (B, H, S, Dh) each
        context = attention(q, k, v, mask).output  # (B, H, S, Dh), as the model's
        B, H, S, Dh = context.shape
        x = self._residual(
            x, linears["out"](context.transpose(1, 2).reshape(B, S, H * Dh)), norms[0]
        )
        h = norms[1](x) if self.cfg.norm_first else x
        return self._residual(
            x, linears["ff2"](layer.feed_forward.activation(linears["ff1"](h))), norms[1]
        )

    def _residual(self, x: Tensor, sublayer_output: Tensor, norm: nn.Module) -> Tensor:
        x = x + sublayer_output
        return x if self.cfg.norm_first else norm(x)

    # ---------------------------------------------------------------------------- decoder

    def embed_rows(self, tgt_ids: Tensor, positions: Tensor, end: int) -> Tensor:
        """One token per row at its own position: ids (N,), positions (N,) < `end` -> (N, D)."""
        model = self.model
        embedded = model.tgt_embed(tgt_ids) * model.embed_scale  # (N, D)
        return embedded + model.positional.rows(positions, end).to(embedded.dtype)

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every decoder layer's cross-attention keys and values, (B, H, S, Dh) each."""
        return [self._cross_kv_heads(linears, memory) for linears in self.decoder_linears]

    def _cross_kv_heads(self, linears: nn.ModuleDict, memory: Tensor) -> tuple[Tensor, Tensor]:
        k, v = split_heads(linears["cross_kv"](memory), 2, self.cfg.n_heads)
        return k, v

    def decoder_step(
        self, x: Tensor, memory: Tensor | None, src_mask: Tensor | None, caches: list[StepCache]
    ) -> Tensor:
        """The decoder on one new token per row: x (N, D) -> (N, D) after the final norm.

        `memory` (B, S, D) and `src_mask` (B, S) are read on the first step only (the caches
        keep the cross-attention keys/values and the mask bias); None when the caches have
        them already (`engine.continuous`).
        """
        layers = self.model.decoder.layers
        for layer, linears, cache in zip(layers, self.decoder_linears, caches, strict=True):
            norms = layer.norms
            h = norms[0](x) if self.cfg.norm_first else x
            x = self._residual(x, self._self_step(linears, h, cache), norms[0])
            h = norms[1](x) if self.cfg.norm_first else x
            x = self._residual(x, self._cross_step(linears, h, memory, src_mask, cache), norms[1])
            h = norms[2](x) if self.cfg.norm_first else x
            x = self._residual(
                x, linears["ff2"](layer.feed_forward.activation(linears["ff1"](h))), norms[2]
            )
        return self.model.decoder.final_norm(x)

    def _self_step(self, linears: nn.ModuleDict, h: Tensor, cache: StepCache) -> Tensor:
        """h (N, D) -> self-attention output (N, D); appends this position's K/V to `cache`."""
        N, D, H, Dh = h.size(0), h.size(1), self.cfg.n_heads, self.cfg.d_head
        qkv = linears["self_qkv"](h)  # (N, 3D)
        q, kv = qkv[:, :D], qkv[:, D:]
        k, v = cache.append(
            kv[:, :D].view(N, H, 1, Dh), kv[:, D:].view(N, H, 1, Dh)
        )  # (N, H, t, Dh)
        t = k.size(2)
        q = (q * (1.0 / math.sqrt(Dh))).view(N * H, 1, Dh)  # the copy makes it contiguous
        keys = k.reshape(N * H, t, Dh).transpose(1, 2)  # (N * H, Dh, t)
        if cache.self_bias is None:
            scores = torch.bmm(q, keys)  # (N * H, 1, t)
        else:  # rows at different positions: each sees its own past only
            scores = torch.baddbmm(cache.self_bias, q, keys)
        context = torch.bmm(torch.softmax(scores, dim=-1), v.reshape(N * H, t, Dh))
        return linears["self_out"](context.view(N, D))

    def _cross_step(
        self,
        linears: nn.ModuleDict,
        h: Tensor,  # (N, D), N = B * K
        memory: Tensor | None,
        src_mask: Tensor | None,
        cache: StepCache,
    ) -> Tensor:
        """Encoder-decoder attention of one token per row (N, D). The K rows of a sentence
        attend together, as K queries per head, to its one set of keys and values."""
        if cache.cross_k is None or cache.cross_v is None:  # contiguous once, not every step
            k, v = self._cross_kv_heads(linears, memory)
            cache.cross_k, cache.cross_v = k.contiguous(), v.contiguous()
        k, v = cache.cross_k, cache.cross_v  # (B, H, S, Dh)
        B, H, S, Dh = k.shape
        if cache.cross_bias is None:  # (B, H, 1, S): 0 where a key may be seen, -inf where not
            bias = torch.zeros(B, 1, 1, S, dtype=k.dtype, device=k.device)
            bias.masked_fill_(~src_mask.view(B, 1, 1, S), float("-inf"))
            cache.cross_bias = bias.expand(B, H, 1, S).contiguous()
        N, D = h.shape
        K = rows_per_sentence(N, B)
        q = linears["cross_q"](h).view(B, K, H, Dh).transpose(1, 2).reshape(B * H, K, Dh)
        keys = k.reshape(B * H, S, Dh).transpose(1, 2)  # (B * H, Dh, S)
        bias = cache.cross_bias.view(B * H, 1, S)
        scores = torch.baddbmm(bias, q, keys, alpha=1.0 / math.sqrt(Dh))  # (B * H, K, S)
        context = torch.bmm(torch.softmax(scores, dim=-1), v.reshape(B * H, S, Dh))
        return linears["cross_out"](context.view(B, H, K, Dh).transpose(1, 2).reshape(N, D))


# ------------------------------------------------------------------ the engine's linear layers


class PackedLinear(nn.Module):
    """A CPU linear layer on copies of its weight pre-packed for oneDNN. Float32 inputs outside
    autocast take the float32 copy (`fp32`; without it, the layer's own `F.linear`); under
    CPU autocast to bf16, float32 and bf16 inputs take a bf16 copy (`bf16`, where oneDNN has
    bf16 on this CPU: `bf16_packing_runs`), made at the first such call: autocast's result
    (the same bf16 operands in oneDNN's matmul, the bias added before the one rounding to
    bf16), without casting the weight at every call, which cost more than the matmul at a few
    rows (docs/benchmarks.md, "bf16 on packed weights"). Anything else (fp16, another device,
    an input that needs a gradient) takes `F.linear` on the layer's own parameters. The
    float32 copy (and the bias of both) is taken when the layer is built, the bf16 one at its
    first use: neither follows later changes of the weights (build a new engine then)."""

    def __init__(self, linear: nn.Linear | Rows, fp32: bool = True, bf16: bool = True) -> None:
        super().__init__()
        self.linear = linear
        weight = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None) if fp32 else None
        self.bias = None if linear.bias is None else linear.bias.detach().clone()
        self.packs_bf16 = bf16 and bf16_packing_runs()
        self.bf16: tuple[Tensor, Tensor | None] | None = None  # (packed weight, bias) in bf16

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu" or x.requires_grad:
            return self.linear(x)
        if torch.is_autocast_enabled("cpu"):  # bf16 (and float32 or bf16 x): the bf16 copy
            bf16 = self.packs_bf16 and torch.get_autocast_dtype("cpu") == torch.bfloat16
            if not bf16 or x.dtype not in (torch.float32, torch.bfloat16):
                return self.linear(x)
            weight, bias = self.bf16 or self._pack_bf16()
            return _packed_matmul(x.to(torch.bfloat16), weight, bias)
        if x.dtype != torch.float32 or self.packed is None:
            return self.linear(x)
        return _packed_matmul(x, self.packed, self.bias)

    def _pack_bf16(self) -> tuple[Tensor, Tensor | None]:
        with _PACKING:  # searches on several threads (--inter-threads) make one copy
            if self.bf16 is None:
                weight = self.linear.weight.detach().to(torch.bfloat16)
                bias = None if self.bias is None else self.bias.to(torch.bfloat16)
                self.bf16 = (torch.ops.mkldnn._reorder_linear_weight(weight, None), bias)
            return self.bf16


_PACKING = threading.Lock()  # module-level: a layer stays deep-copyable and picklable


def bf16_autocast() -> bool:
    """Whether the calling thread runs under CPU autocast to bf16."""
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def _packed_matmul(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    rows = x.reshape(-1, x.size(-1))  # (*, in) -> (M, in): oneDNN's linear takes 2-D
    out = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.size(-1))


Prepare = Callable[[nn.Module], nn.Module]  # a linear layer or `Rows` -> what the engine runs


def _shared(linear: nn.Linear) -> nn.Module:
    return linear


def _copy(linear: nn.Linear) -> nn.Module:  # to be quantized: a copy, the model keeps its own
    copy = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    copy.to(linear.weight)
    copy.load_state_dict(linear.state_dict())
    return copy


def _rows(linear: nn.Linear, start: int, end: int, prepare: Prepare) -> nn.Module:
    """Rows `start:end` of `linear`: a view of the layer's, packed, or (int8) a copy of them."""
    if prepare is _copy:
        part = nn.Linear(linear.in_features, end - start).to(linear.weight)
        with torch.no_grad():
            part.weight.copy_(linear.weight[start:end])
            part.bias.copy_(linear.bias[start:end])
        return part
    return prepare(Rows(linear, start, end))


def _encoder_linears(layer: nn.Module, prepare: Prepare) -> nn.ModuleDict:
    return nn.ModuleDict(
        {
            "qkv": prepare(layer.self_attn.in_proj),
            "out": prepare(layer.self_attn.out_proj),
            "ff1": prepare(layer.feed_forward.linear1),
            "ff2": prepare(layer.feed_forward.linear2),
        }
    )


def _decoder_linears(layer: nn.Module, prepare: Prepare) -> nn.ModuleDict:
    D, cross = layer.self_attn.d_model, layer.cross_attn.in_proj
    return nn.ModuleDict(
        {
            "self_qkv": prepare(layer.self_attn.in_proj),
            "self_out": prepare(layer.self_attn.out_proj),
            "cross_q": _rows(cross, 0, D, prepare),
            "cross_kv": _rows(cross, D, 3 * D, prepare),
            "cross_out": prepare(layer.cross_attn.out_proj),
            "ff1": prepare(layer.feed_forward.linear1),
            "ff2": prepare(layer.feed_forward.linear2),
        }
    )
