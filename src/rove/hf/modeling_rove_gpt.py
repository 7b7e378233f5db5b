"""Hugging Face form of rove's GPT (any ``pos``: learned, nope, rope, rove), self-contained.

``rove export`` copies this file next to ``config.json`` so that
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` works with torch and
transformers alone (no ``rove`` install); ``rove.hf.load_exported`` registers the same classes
with the Auto* factories so no remote code is needed where rove is installed. Parameter names are
those of ``rove.model.GPT``, so an export's weights are rove's state dict unchanged.

The forward pass restates rove's: pre-LayerNorm blocks, tanh-GELU MLP, one fused ``[q | k | v]``
projection (``[q | kv]`` with shared K = V), GQA, cos/sin from float64 angles, and for RoVE the
values rotated at their own position and the attention output rotated back at the query's
position. A frequency scaling trained into the model (``rove finetune --scaling``) is exported
as its result, not its formula: the float64 frequencies (``rope_inv_freq``) and YaRN's logit
scale (``rope_logit_scale``), so this file restates no schedule. The HF cache therefore stores rotated values, and a decoding step costs one rotation.
Padding: ``attention_mask`` (batch, keys) masks padded keys; every query also sees itself, so a
padded query row never becomes NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

# rove.model.MODEL_POS_CHOICES and rove.rotary.CONVENTIONS, restated (this file imports no rove);
# tests/test_hf_export.py pins them to the library's
MODEL_POS_CHOICES = ("learned", "nope", "rope", "rove")
CONVENTIONS = ("half", "interleaved")
# transformers 5.24 renamed the cache argument and output field from past_key_values to cache
_CACHE_FIELD = (
    "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
)


class RoveGPTConfig(PretrainedConfig):
    """rove's ``GPTConfig`` fields, under HF's names where HF tools read them."""

    model_type = "rove_gpt"
    attribute_map = {  # noqa: RUF012 (HF reads this class attribute)
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "block_size",
    }

    def __init__(
        self,
        vocab_size: int = 50304,
        block_size: int = 1024,
        n_layer: int = 12,
        n_head: int = 12,
        n_kv_head: int | None = None,
        n_embd: int = 768,
        pos: str = "rove",
        shared_kv: bool = False,
        rotary_dim: int | None = None,
        rope_base: float = 10000.0,
        rope_convention: str = "half",
        rope_inv_freq: list[float] | None = None,
        rope_logit_scale: float = 1.0,
        mlp_ratio: int = 4,
        bias: bool = False,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        **kwargs: object,
    ) -> None:
        if pos not in MODEL_POS_CHOICES:
            raise ValueError(f"unknown pos {pos!r}; choose one of {MODEL_POS_CHOICES}")
        if rope_convention not in CONVENTIONS:
            raise ValueError(
                f"unknown rope_convention {rope_convention!r}; choose one of {CONVENTIONS}"
            )
        self.vocab_size, self.block_size, self.n_layer = vocab_size, block_size, n_layer
        self.n_head, self.n_kv_head, self.n_embd = n_head, n_kv_head, n_embd
        self.pos, self.shared_kv, self.rotary_dim = pos, shared_kv, rotary_dim
        self.rope_base, self.rope_convention = rope_base, rope_convention
        # a trained frequency scaling: its rotary_dim/2 frequencies (None: base^(-2m/r)) and
        # the factor of every attention logit (YaRN's temperature, rove's "logits" placement)
        self.rope_inv_freq, self.rope_logit_scale = rope_inv_freq, rope_logit_scale
        self.mlp_ratio, self.bias, self.use_cache = mlp_ratio, bias, use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)  # type: ignore[call-arg, arg-type]  # HF types its own fields only, yet takes any


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, convention: str, inverse: bool = False
) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` channels of ``x`` ``(B, H, T, D)``; the rest pass.

    ``cos``/``sin`` are ``(B, 1, T, r/2)``; arithmetic in the tables' dtype, as in rove.
    """
    half = cos.shape[-1]
    rot = 2 * half
    xr = x[..., :rot].to(cos.dtype)
    if inverse:
        sin = -sin
    if convention == "half":
        a, b = xr[..., :half], xr[..., half:]
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    else:
        a, b = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((out.to(x.dtype), x[..., rot:]), dim=-1)


class _Attention(nn.Module):
    def __init__(self, config: RoveGPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head or config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.shared_kv, self.pos = config.shared_kv, config.pos
        self.convention, self.layer_idx = config.rope_convention, layer_idx
        self.scale = config.rope_logit_scale / math.sqrt(self.head_dim)
        n_proj = self.n_head + (1 if self.shared_kv else 2) * self.n_kv_head
        self.qkv = nn.Linear(config.n_embd, n_proj * self.head_dim, bias=config.bias)
        self.proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=config.bias)

    def forward(
        self,
        x: torch.Tensor,
        tables: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
        cache: Cache | None,
    ) -> torch.Tensor:
        bsz, seq, _ = x.shape
        n_total = self.n_head + (1 if self.shared_kv else 2) * self.n_kv_head
        heads = self.qkv(x).view(bsz, seq, n_total, self.head_dim).transpose(1, 2)  # (B,H,T,D)
        q = heads[:, : self.n_head]
        k = heads[:, self.n_head : self.n_head + self.n_kv_head]
        v = k if self.shared_kv else heads[:, self.n_head + self.n_kv_head :]
        if tables is not None:
            q, k_rot = _rotate(q, *tables, self.convention), _rotate(k, *tables, self.convention)
            v = _rotate(v, *tables, self.convention) if self.pos == "rove" else v
            k = k_rot
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None and seq > 1,
            scale=self.scale,
            enable_gqa=self.n_head != self.n_kv_head,
        )  # (B, Hq, T, D)
        if self.pos == "rove":
            assert tables is not None
            out = _rotate(out, *tables, self.convention, inverse=True)
        return self.proj(out.transpose(1, 2).reshape(bsz, seq, self.n_head * self.head_dim))


class _MLP(nn.Module):
    def __init__(self, config: RoveGPTConfig) -> None:
        super().__init__()
        width = config.mlp_ratio * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, width, bias=config.bias)
        self.c_proj = nn.Linear(width, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class _Block(nn.Module):
    def __init__(self, config: RoveGPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = _Attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = _MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        tables: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
        cache: Cache | None,
    ) -> torch.Tensor:
        """``tables`` and ``mask`` are built once per forward, for every layer (as in rove)."""
        x = x + self.attn(self.ln_1(x), tables, mask, cache)
        return x + self.mlp(self.ln_2(x))


class RoveGPTForCausalLM(PreTrainedModel, GenerationMixin):
    """rove's GPT as a Hugging Face causal LM (``generate``, caches, padding masks)."""

    config_class = RoveGPTConfig
    base_model_prefix = "rove_gpt"
    _no_split_modules = ["_Block"]  # noqa: RUF012
    _tied_weights_keys = {"lm_head.weight": "wte.weight"}  # noqa: RUF012

    def __init__(self, config: RoveGPTConfig) -> None:
        super().__init__(config)
        self.wte: nn.Module = nn.Embedding(config.vocab_size, config.n_embd)
        learned = config.pos == "learned"
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if learned else None
        self.blocks = nn.ModuleList(_Block(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        head_dim = config.n_embd // config.n_head
        self.rotary_dim = (config.rotary_dim or head_dim) if config.pos in ("rope", "rove") else 0
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def get_input_embeddings(self) -> nn.Module:
        return self.wte

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.wte = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos/sin ``(B, 1, T, r/2)`` of ``w_m = base^(-2m/r)`` (or the trained scaling's
        ``rope_inv_freq``) at ``positions``, float64 angles."""
        rot, device = self.rotary_dim, positions.device
        if self.config.rope_inv_freq is not None:
            inv_freq = torch.tensor(self.config.rope_inv_freq, dtype=torch.float64, device=device)
        else:
            exponents = torch.arange(0, rot, 2, dtype=torch.float64, device=device) / rot
            inv_freq = self.config.rope_base**-exponents
        angles = positions.to(torch.float64)[..., None] * inv_freq
        table = torch.float64 if dtype == torch.float64 else torch.float32
        return angles.cos().to(table)[:, None], angles.sin().to(table)[:, None]

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        past_key_values: Cache | None = None,
        **kwargs: object,
    ) -> CausalLMOutputWithPast:
        cache = past_key_values if cache is None else cache
        x = self.wte(input_ids) if inputs_embeds is None else inputs_embeds
        bsz, seq = x.shape[:2]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + seq, device=x.device)[None].expand(bsz, -1)
        if self.wpe is not None:
            if int(position_ids.max()) >= self.config.block_size:
                raise ValueError(
                    f"position {int(position_ids.max())} is beyond the learned position table "
                    f"(block_size {self.config.block_size})"
                )
            x = x + self.wpe(position_ids)
        tables = self._tables(position_ids, x.dtype) if self.rotary_dim else None
        mask = None
        if attention_mask is not None or (past and seq > 1):
            q_idx = torch.arange(past, past + seq, device=x.device)[:, None]
            k_idx = torch.arange(past + seq, device=x.device)[None]
            mask = (k_idx <= q_idx)[None, None]  # (1, 1, T, S)
            if attention_mask is not None:
                keys = attention_mask[:, None, None, : past + seq].bool()  # (B, 1, 1, S)
                mask = (mask & keys) | (k_idx == q_idx)
        for block in self.blocks:
            x = block(x, tables, mask, cache)
        hidden = self.ln_f(x)
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100
            )
        cache_field = {_CACHE_FIELD: cache if use_cache else None}
        return CausalLMOutputWithPast(loss=loss, logits=logits, **cache_field)  # type: ignore[arg-type]  # a field named per version
