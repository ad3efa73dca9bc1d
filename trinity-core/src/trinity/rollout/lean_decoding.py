"""A lean decoding step for Llama-like models: :class:`LeanDecoder`.

A decoding step feeds one token per row. transformers' forward spends much of such a step,
on a small model, in per-call work that does not depend on the batch (some 500 operator calls
a forward of the quickstart's two-layer model: mask building, cache bookkeeping, views,
``repeat_kv``, hooks); the arithmetic itself is some 20 operators a layer. This module runs that arithmetic directly on the
model's own parameters: one matrix product for q, k and v and one for gate and up (the
model's q/k/v and gate/up weights become slices of one tensor each: no copy), ``rms_norm``, rotary tables looked up by
position, a key/value cache written in place into preallocated room (doubled when full), and an
attention of two batched matrix products over the key/value heads (no ``repeat_kv``).

It covers transformers' ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` with full attention and a
static rotary embedding. :meth:`LeanDecoder.for_model` checks the structure, then runs two
decoding steps (with a row dropped between them) both ways on a small made-up batch and
compares the logits: a model it does not cover, or one whose logits differ, keeps
transformers' forward. The logits are the same up to floating-point rounding (the products
and the attention add in another order), so sampled tokens can differ from transformers'
forward in rare near-ties; ``enforce_eager: true`` on the rollout model turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

#: transformers classes whose decoder layers this module reproduces.
SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")
# Rotary types whose tables depend on the sequence length seen so far (not a fixed table).
_DYNAMIC_ROPE = ("dynamic", "longrope")
# Largest logit difference accepted by the load-time check, relative to the logits' scale.
_TOLERANCE = {"float32": 1e-4, "float64": 1e-8}
_LOW_PRECISION_TOLERANCE = 5e-2


class NotCovered(Exception):
    """The model is not one :class:`LeanDecoder` reproduces (the message says why)."""


class LogitsDiffer(NotCovered):
    """The model looks covered, but the load-time check's logits differ from transformers'."""


@dataclass
class _Layer:
    """One decoder layer's parameters (the model's own tensors; see :meth:`LeanDecoder._fuse`)."""

    attn_norm: torch.Tensor
    attn_eps: float
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    mlp_norm: torch.Tensor
    mlp_eps: float
    gate_up_weight: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None


class DecodeState:
    """The key/value cache and attention bias of one call's rows (see :meth:`LeanDecoder.start`)."""

    def __init__(
        self, keys: list[torch.Tensor], values: list[torch.Tensor], bias: torch.Tensor, filled: int
    ) -> None:
        self.keys, self.values = keys, values
        #: ``(B, kv_heads, 1, capacity)``: 0 for columns a row attends to, ``-inf`` for its padding.
        self.bias = bias
        #: Columns of the cache written so far.
        self.filled = filled

    def select(self, rows: torch.Tensor) -> None:
        """Keeps only ``rows`` (indices into the current rows), in that order."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.bias = self.bias.index_select(0, rows)


def _cache_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's ``(keys, values)``, ``(B, kv_heads, T, head_dim)``, of a transformers cache."""
    if hasattr(cache, "layers"):  # transformers 5
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):  # transformers 4
        return list(zip(cache.key_cache, cache.value_cache, strict=True))
    raise NotCovered(f"unknown cache type {type(cache).__name__}")


class LeanDecoder:
    """Decoding steps of a Llama-like transformers model, computed on its parameters.

    Build it with :meth:`for_model`; then, per call, :meth:`start` from the model's cache of the
    columns so far, :meth:`step` once per token, :meth:`DecodeState.select` to drop rows.
    """

    def __init__(self, model: Any) -> None:
        name = type(model).__name__
        if name not in SUPPORTED or not type(model).__module__.startswith("transformers."):
            raise NotCovered(f"{name} is not one of {', '.join(SUPPORTED)}")
        config = model.config
        base = model.model
        if getattr(config, "hidden_act", None) != "silu":
            raise NotCovered(f"activation {getattr(config, 'hidden_act', None)!r} (covers silu)")
        if getattr(config, "pretraining_tp", 1) != 1:
            raise NotCovered("pretraining_tp != 1")
        layer_types = getattr(config, "layer_types", None) or []
        if any(kind != "full_attention" for kind in layer_types):
            raise NotCovered("sliding-window layers")
        if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
            raise NotCovered("sliding-window attention")
        rope_type = str(getattr(base.rotary_emb, "rope_type", "default"))
        if any(kind in rope_type for kind in _DYNAMIC_ROPE):
            raise NotCovered(f"rotary type {rope_type!r} depends on the sequence length")
        if getattr(model, "hf_quantizer", None) is not None:
            raise NotCovered("quantised weights")
        if getattr(model.lm_head, "bias", None) is not None:
            raise NotCovered("an output bias")
        attn = base.layers[0].self_attn
        self.model = model
        self.head_dim = attn.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.scaling = getattr(attn, "scaling", self.head_dim**-0.5)
        self.dtype = model.lm_head.weight.dtype
        self._sources_key: tuple[int, ...] | None = None
        # Fused tensors by the (id, data_ptr) of the parameters that are their slices.
        self._fused: dict[tuple[tuple[int, int], ...], torch.Tensor] = {}
        #: The largest logit difference the load-time check measured (see :meth:`for_model`).
        self.difference = float("nan")
        self.layers: list[_Layer] = []
        self._capacity = 0  # positions the rotary tables cover (see _tables)
        self._cos = self._sin = None

    @classmethod
    def for_model(cls, model: Any) -> LeanDecoder:
        """A decoder for ``model`` whose logits were checked against transformers' forward;
        raises :class:`NotCovered` (saying why) when the model is not covered or they differ."""
        try:
            decoder = cls(model)
            worst, scale = decoder.check()
        except NotCovered:
            raise
        except Exception as exc:  # e.g. a transformers version whose modules look otherwise
            raise NotCovered(f"{type(exc).__name__}: {exc}") from exc
        tolerance = _TOLERANCE.get(str(decoder.dtype).removeprefix("torch."), _LOW_PRECISION_TOLERANCE)
        if not worst <= tolerance * max(1.0, scale):  # also catches NaN
            raise LogitsDiffer(
                f"the lean decoding step's logits differ from transformers' forward by {worst:.3g} (logits up to "
                f"{scale:.3g}; accepted {tolerance:g} of that)"
            )
        decoder.difference = worst
        return decoder

    # -- parameters -------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Takes the model's tensors again when one was replaced (not merely written into).

        The fused q/k/v and gate/up products are not copies: the model's own q/k/v (gate/up)
        weights become consecutive slices of one tensor (:meth:`_fuse`), so weight syncs,
        which copy into the model's tensors in place, write the fused products too, and the
        fusion costs no memory."""
        key = self._tensors_key()
        if key == self._sources_key:
            return
        layers, fused = [], {}
        with torch.no_grad():
            for layer in self.model.model.layers:
                a, m = layer.self_attn, layer.mlp
                qkv, gate_up = (a.q_proj, a.k_proj, a.v_proj), (m.gate_proj, m.up_proj)
                layers.append(
                    _Layer(
                        attn_norm=layer.input_layernorm.weight,
                        attn_eps=layer.input_layernorm.variance_epsilon,
                        qkv_weight=self._fuse(qkv, "weight", fused),
                        qkv_bias=self._fuse(qkv, "bias", fused),
                        o_weight=a.o_proj.weight,
                        o_bias=a.o_proj.bias,
                        mlp_norm=layer.post_attention_layernorm.weight,
                        mlp_eps=layer.post_attention_layernorm.variance_epsilon,
                        gate_up_weight=self._fuse(gate_up, "weight", fused),
                        gate_up_bias=self._fuse(gate_up, "bias", fused),
                        down_weight=m.down_proj.weight,
                        down_bias=m.down_proj.bias,
                    )
                )
        self.layers, self._fused = layers, fused
        self._capacity = 0  # the rotary tables are computed again too
        # Taken after fusing: fusing replaces the parameters it fuses by slices of one tensor.
        self._sources_key = self._tensors_key()

    def _tensors_key(self) -> tuple[int, ...]:
        """Changes when a parameter or buffer is replaced (its id and data_ptr), or a buffer
        (the rotary frequencies) is written into (its version counter)."""
        key = tuple(x for p in self.model.parameters() for x in (id(p), p.data_ptr()))
        return key + tuple(x for b in self.model.buffers() for x in (id(b), b.data_ptr(), b._version))

    def _fuse(self, linears: tuple[Any, ...], name: str, fused: dict) -> torch.Tensor | None:
        """One tensor of the ``name`` parameters (``weight`` or ``bias``) of ``linears``,
        stacked by output feature, whose slices the linears' parameters then are (the
        parameters are replaced by those slices the first time; later calls find them)."""
        tensors = [getattr(lin, name) for lin in linears]
        if all(t is None for t in tensors):
            return None
        if any(t is None for t in tensors):
            raise NotCovered(f"some of the fused products have a {name}, some not")
        key = tuple((id(t), t.data_ptr()) for t in tensors)
        whole = self._fused.get(key)
        if whole is None:
            # A normal tensor even when called under inference mode (the check, a decoding
            # call): weight syncs write into these parameters outside it.
            offset, params = 0, []
            with torch.inference_mode(False), torch.no_grad():
                whole = torch.cat([t.detach() for t in tensors])
                for lin, t in zip(linears, tensors, strict=True):
                    part = whole[offset : offset + t.shape[0]]
                    params.append(torch.nn.Parameter(part, requires_grad=t.requires_grad))
                    setattr(lin, name, params[-1])
                    offset += t.shape[0]
            key = tuple((id(t), t.data_ptr()) for t in params)
        fused[key] = whole
        return whole

    # -- decoding ---------------------------------------------------------------------------

    def start(self, cache: Any, attention_mask: torch.Tensor, room: int = 64) -> DecodeState:
        """A state holding ``cache`` (transformers' cache of the first ``T`` columns of every
        row; ``attention_mask`` ``(B, >= T)`` says which are real, and columns past it are)
        with room for ``room`` more columns; :meth:`step` grows it when they run out."""
        self._refresh()
        tensors = _cache_tensors(cache)
        if len(tensors) != len(self.layers):
            raise NotCovered(f"the cache has {len(tensors)} layers, the model {len(self.layers)}")
        rows, kv_heads, filled, head_dim = tensors[0][0].shape
        capacity = filled + max(1, room)
        keys, values = [], []
        for k, v in tensors:
            kbuf = k.new_empty((rows, kv_heads, capacity, head_dim))
            vbuf = v.new_empty((rows, kv_heads, capacity, head_dim))
            kbuf[:, :, :filled] = k
            vbuf[:, :, :filled] = v
            keys.append(kbuf)
            values.append(vbuf)
        real = torch.ones((rows, capacity), dtype=torch.bool, device=attention_mask.device)
        width = min(attention_mask.shape[1], capacity)
        real[:, :width] = attention_mask[:, :width].bool()
        bias = torch.zeros((rows, capacity), dtype=self.dtype, device=attention_mask.device)
        bias.masked_fill_(~real, float("-inf"))
        # One copy per key/value head, so that the attention's batched products read it as a view.
        bias = bias[:, None, None, :].expand(rows, kv_heads, 1, capacity).contiguous()
        self._tables(capacity, attention_mask.device)
        return DecodeState(keys, values, bias, filled)

    def _grow(self, state: DecodeState) -> None:
        """Doubles the columns of ``state`` (its cache was full)."""
        capacity = state.keys[0].shape[2]
        more = max(capacity, 16)

        def wider(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros((*t.shape[:2], t.shape[2] + more, *t.shape[3:]))
            out[:, :, :capacity] = t
            return out

        state.keys = [wider(k) for k in state.keys]
        state.values = [wider(v) for v in state.values]
        state.bias = torch.cat([state.bias, state.bias.new_zeros((*state.bias.shape[:3], more))], dim=3)
        self._tables(capacity + more, state.bias.device)

    def _tables(self, capacity: int, device: Any) -> None:
        """The rotary cos/sin of every position below ``capacity`` (the model's own rotary
        module computes them, so scaled variants come out as transformers has them)."""
        if self._capacity >= capacity and self._cos.device == torch.device(device):
            return
        size = max(capacity, 2 * self._capacity)
        positions = torch.arange(size, device=device)[None]
        probe = torch.empty((1, 1), dtype=self.dtype, device=device)
        with torch.no_grad():
            cos, sin = self.model.model.rotary_emb(probe, positions)
        self._cos, self._sin = cos[0], sin[0]
        self._capacity = size

    def step(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The logits ``(B, vocab)`` after feeding ``tokens`` ``(B,)`` at ``positions``
        ``(B,)`` or ``(B, 1)``; writes their keys and values into the next column of ``state``."""
        F = torch.nn.functional
        rows = tokens.shape[0]
        col = state.filled
        if col >= state.keys[0].shape[2]:
            self._grow(state)
        base = self.model.model
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        positions = positions.reshape(rows)
        cos = self._cos[positions].unsqueeze(1)  # (B, 1, head_dim): q and k heads alike
        sin = self._sin[positions].unsqueeze(1)
        half = head_dim // 2
        bias = state.bias[:, :, :, : col + 1].reshape(rows * kv_heads, 1, col + 1)
        hidden = F.embedding(tokens, base.embed_tokens.weight)
        for i, layer in enumerate(self.layers):
            x = _rms_norm(hidden, layer.attn_norm, layer.attn_eps)
            qkv = F.linear(x, layer.qkv_weight, layer.qkv_bias).view(rows, heads + 2 * kv_heads, head_dim)
            qk = qkv[:, : heads + kv_heads]
            rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = qk * cos + rotated * sin
            keys, values = state.keys[i], state.values[i]
            keys[:, :, col] = qk[:, heads:]
            values[:, :, col] = qkv[:, heads + kv_heads :]
            q = qk[:, :heads].reshape(rows * kv_heads, group, head_dim)
            k = keys[:, :, : col + 1].reshape(rows * kv_heads, col + 1, head_dim)
            v = values[:, :, : col + 1].reshape(rows * kv_heads, col + 1, head_dim)
            scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=self.scaling)
            if scores.dtype in (torch.float32, torch.float64):
                weights = torch.softmax(scores, dim=-1)
            else:  # as transformers' eager attention: the softmax in float32
                weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
            attended = torch.bmm(weights, v).view(rows, heads * head_dim)
            hidden = hidden + F.linear(attended, layer.o_weight, layer.o_bias)
            x = _rms_norm(hidden, layer.mlp_norm, layer.mlp_eps)
            gate, up = F.linear(x, layer.gate_up_weight, layer.gate_up_bias).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer.down_weight, layer.down_bias)
        state.filled = col + 1
        hidden = _rms_norm(hidden, base.norm.weight, base.norm.variance_epsilon)
        return F.linear(hidden, self.model.lm_head.weight)

    # -- the load-time check ----------------------------------------------------------------

    @torch.inference_mode()
    def check(self) -> tuple[float, float]:
        """Runs two decoding steps both ways (transformers' forward and :meth:`step`) on a
        made-up left-padded batch, dropping a row between them; returns the largest logit
        difference and the largest logit magnitude."""
        from trinity.trainer.batch import position_ids_from_mask

        device = self.model.lm_head.weight.device
        vocab = self.model.lm_head.weight.shape[0]
        generator = torch.Generator().manual_seed(0)
        lengths = [6, 4, 2]
        width = max(lengths)
        ids = torch.randint(0, vocab, (len(lengths), width + 2), generator=generator).to(device)
        mask = torch.zeros((len(lengths), width), dtype=torch.long, device=device)
        for row, length in enumerate(lengths):
            mask[row, width - length :] = 1
        prefix = self.model(
            input_ids=ids[:, : width - 1],
            attention_mask=mask[:, : width - 1],
            position_ids=position_ids_from_mask(mask[:, : width - 1]),
            use_cache=True,
        ).past_key_values
        state = self.start(prefix, mask, room=1)  # the second step grows it
        positions = mask.sum(-1) - 1
        worst = scale = 0.0
        keep = torch.tensor([0, 2], device=device)
        full_mask = mask
        for step in range(2):
            column = ids[:, width - 1 + step]
            lean = self.step(state, column, positions).float()
            reference = (
                self.model(
                    input_ids=column[:, None],
                    attention_mask=full_mask,
                    position_ids=positions[:, None],
                    past_key_values=prefix,
                    use_cache=True,
                )
                .logits[:, -1]
                .float()
            )
            worst = max(worst, float((lean - reference).abs().max()))
            scale = max(scale, float(reference.abs().max()))
            if step == 0:  # drop the middle row from both, then one more column
                prefix.batch_select_indices(keep)
                state.select(keep)
                ids, full_mask, positions = ids[keep], full_mask[keep], positions[keep]
            ones = torch.ones((full_mask.shape[0], 1), dtype=full_mask.dtype, device=device)
            full_mask = torch.cat([full_mask, ones], dim=1)
            positions = positions + 1
        return worst, scale


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: normalised in float32, cast back, then scaled."""
    if x.dtype == torch.float32:
        return torch.nn.functional.rms_norm(x, weight.shape, weight, eps)
    normed = torch.nn.functional.rms_norm(x.float(), weight.shape, None, eps)
    return weight * normed.to(x.dtype)


__all__ = ["SUPPORTED", "DecodeState", "LeanDecoder", "LogitsDiffer", "NotCovered"]
