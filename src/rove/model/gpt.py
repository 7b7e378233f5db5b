"""A GPT-2 style decoder whose only moving part is the position encoding.

``pos`` selects learned absolute positions, NoPE, RoPE or RoVE (optionally with shared K = V and
partial rotary); everything else is GPT-2 (pre-LayerNorm blocks, GELU MLP, tied embeddings), so a
RoPE vs RoVE comparison changes exactly one thing.

Notable features:
- positions, cos/sin tables (float64 angles), the packing mask and the smooth conversion's V/O
  tables are built once per forward (``rove.functional.AttentionInputs``) and shared by all
  layers.
- ``token_nll`` computes the LM head in chunks, so long-context evaluation of a 50k vocabulary
  never materialises ``(B, T, V)`` logits.
- ``generate`` decodes with a ``KVCache`` of rotated keys and rotated values, and equals
  uncached generation under every schedule: dynamic NTK's length is pinned to prompt + new
  tokens for the whole generation, cached or not (see ``Rotary.at_length``).
- ``config.rope_scaling`` is a frequency scaling trained into the model (``rove finetune
  --scaling``); ``rope_scaling`` swaps in YaRN / NTK / linear / dynamic-NTK frequencies at
  inference (relative to ``block_size``, on top of a trained scaling where that is exact, see
  ``rove.rotary.scaling_on_top``); the YaRN temperature goes to the logits only (or, with
  ``temperature="rotated"``, to the rotated channels' share of them, as in HF).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from rove.functional import (
    ROTARY_POS,
    AttentionInputs,
    Pos,
    attention_inputs,
    check_fraction,
    check_pos,
)
from rove.kv_cache import KVCache
from rove.layer import RoveAttention, check_cache_use
from rove.loss import chunked_token_nll, mean_cross_entropy
from rove.model.config import GPTConfig
from rove.rotary import SCALING_KINDS, Rotary, Scaling, Temperature, scaling_on_top
from rove.sampling import check_sampling, next_tokens

__all__ = ["GPT"]


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.mlp_ratio * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.mlp_ratio * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


def attention_pos(cfg: GPTConfig) -> Pos:
    """The attention's encoding: a learned table is added to the input, and attention is NoPE."""
    return "nope" if cfg.pos == "learned" else check_pos(cfg.pos)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, rotary: Rotary | None, layer_idx: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = RoveAttention(
            cfg.n_embd,
            cfg.n_head,
            cfg.n_kv_head,
            pos=attention_pos(cfg),
            shared_kv=cfg.shared_kv,
            rotary=rotary,
            bias=cfg.bias,
            layer_idx=layer_idx,
        )
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: torch.Tensor,
        inputs: AttentionInputs | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """``x`` ``(B, T, C)`` -> ``(B, T, C)``; ``inputs`` and ``cache`` as in ``RoveAttention``
        (without ``inputs``, the default positions and no packing)."""
        x = x + self.drop(self.attn(self.ln_1(x), cache=cache, inputs=inputs))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 style language model. ``forward(idx)`` gives logits, ``forward(idx, targets)`` the loss."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.rotary = (
            Rotary(
                config.head_dim,
                config.rotary_dim,
                base=config.rope_base,
                convention=config.rope_convention,  # type: ignore[arg-type]
                scaling=config.rope_scaling,
            )
            if config.pos in ROTARY_POS
            else None
        )
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = (
            nn.Embedding(config.block_size, config.n_embd) if config.pos == "learned" else None
        )
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, self.rotary, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight
        # the smooth conversion's a (``set_rove_fraction``): part of every forward's inputs
        self._rove_fraction = 1.0
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.c_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layer))

    def iter_blocks(self) -> Iterator[Block]:
        """The blocks, typed as such (iterating the ``nn.ModuleList`` gives plain ``nn.Module``s)."""
        for block in self.blocks:
            assert isinstance(block, Block)
            yield block

    @property
    def rove_fraction(self) -> float:
        """The smooth conversion's a: RoVE's V/O rotations at a fraction of their angles
        (1: plain RoVE; see ``set_rove_fraction``)."""
        return self._rove_fraction

    def set_rove_fraction(self, fraction: float) -> None:
        """Rotate V and O by ``R(a p)`` with a = ``fraction``: at 0 the RoPE model exactly (no
        V/O rotation), at 1 plain RoVE, between an attentive convolution with kernels
        ``R(a delta) W_V``. A runtime setting of a ``pos="rove"`` model, not part of its config:
        ``rove finetune --conversion smooth`` ramps it to 1, so what is saved is plain RoVE."""
        if self.config.pos != "rove":
            raise ValueError(
                f"set_rove_fraction needs a pos='rove' model, this one is {self.config.pos!r}"
            )
        self._rove_fraction = check_fraction(fraction)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the (tied) token and position embeddings."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel()
            if self.wpe is not None:
                n -= self.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (6N + attention), as in the PaLM appendix, for MFU."""
        cfg = self.config
        seq_len = seq_len or cfg.block_size
        n = self.num_params(non_embedding=False)
        return 6 * n + 12 * cfg.n_layer * cfg.n_embd * seq_len

    def hidden(
        self,
        idx: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Final (normed) hidden states ``(B, T, C)`` of token ids ``idx`` ``(B, T)``."""
        if idx.ndim != 2 or idx.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"idx must be an integer tensor (batch, seq), got {idx.dtype} {tuple(idx.shape)}"
            )
        bsz, seq = idx.shape
        if cache is not None:
            check_cache_use(self.rotary, doc_ids)
        inputs = attention_inputs(  # once, for every layer
            attention_pos(self.config),
            self.rotary,
            positions,
            doc_ids,
            batch=bsz,
            seq=seq,
            dtype=self.wte.weight.dtype,
            device=idx.device,
            offset=0 if cache is None else cache.length,
            fraction=self._rove_fraction,
        )
        x = self.wte(idx)
        if self.wpe is not None:
            at = inputs.positions.tensor
            top = int(at.max()) + 1 if at.numel() else 0
            if top > self.config.block_size:
                raise ValueError(
                    f"position {top - 1} is beyond the learned position table "
                    f"(block_size {self.config.block_size}); rotary models can go further"
                )
            x = x + self.wpe(at)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, inputs, cache)
        if cache is not None:
            cache.advance(seq)
        return self.ln_f(x)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(B, T, V)``, or with ``targets`` ``(B, T)`` the mean cross-entropy (-1 ignored)."""
        logits = self.lm_head(self.hidden(idx, positions=positions, doc_ids=doc_ids))
        return logits if targets is None else mean_cross_entropy(logits, targets)

    def token_nll(
        self, idx: torch.Tensor, targets: torch.Tensor, *, chunk_size: int = 1024
    ) -> torch.Tensor:
        """Per-token cross-entropy ``(B, T)`` in float32 (0 where ``targets == -1``).

        The LM head runs on ``chunk_size`` positions at a time to bound memory at long lengths.
        """
        return chunked_token_nll(self.hidden(idx), self.lm_head, targets, chunk_size=chunk_size)

    @contextlib.contextmanager
    def rope_scaling(
        self,
        kind: str | None,
        factor: float,
        *,
        temperature: Temperature = "logits",
        length: int | None = None,
    ) -> Iterator[None]:
        """Inference-time frequency scaling relative to ``block_size`` inside the block.

        ``kind`` is None (plain) or one of ``rove.rotary.SCALING_KINDS``; ``factor <= 1`` or a
        model without rotary leaves the model unchanged. On a model trained with a scaling
        (``config.rope_scaling``) the two combine by ``rove.rotary.scaling_on_top``: the same
        kind of linear, NTK or YaRN multiplies the factors; anything else is a ``ValueError``
        (which ``rove eval`` records as that row's reason). ``temperature`` places YaRN's logit scale
        (``Rotary``'s argument: "logits" as in the paper, "rotated" as in HF). ``length`` pins
        dynamic NTK's length (``Rotary.at_length``), which decoding with a ``KVCache`` needs.
        """
        if kind is not None and kind not in SCALING_KINDS:
            raise ValueError(f"unknown rope scaling {kind!r}; choose one of {SCALING_KINDS}")
        if self.rotary is None or kind is None or factor <= 1:
            yield
            return
        trained = self.config.rope_scaling
        scaling = scaling_on_top(
            None if trained is None else Scaling.from_dict(trained),
            kind,
            factor,
            self.config.block_size,
        )
        scaled = self.rotary.with_scaling(scaling, temperature=temperature)
        with self._using_rotary(scaled if length is None else scaled.at_length(length)):
            yield

    @contextlib.contextmanager
    def _using_rotary(self, rotary: Rotary | None) -> Iterator[None]:
        original = self.rotary
        self._set_rotary(rotary)
        try:
            yield
        finally:
            self._set_rotary(original)

    def _set_rotary(self, rotary: Rotary | None) -> None:
        self.rotary = rotary
        for block in self.iter_blocks():
            block.attn.rotary = rotary

    @torch.inference_mode()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        *,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend ``idx`` ``(B, T)`` by ``max_new_tokens`` tokens: greedy at temperature 0,
        else sampled (optionally from the ``top_k`` most likely). Returns ``(B, T + new)``.

        Under dynamic NTK the length is pinned to ``T + max_new_tokens`` for every step, cached
        or not: the frequencies of a forward over the final sequence, so a cache stays valid.
        """
        check_sampling(temperature, top_k)
        if max_new_tokens <= 0:
            return idx
        pinned = (
            None if self.rotary is None else self.rotary.at_length(idx.shape[1] + max_new_tokens)
        )
        with self._using_rotary(pinned):
            return self._generate(idx, max_new_tokens, temperature, top_k, use_cache, generator)

    def _generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        use_cache: bool,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        cache = None
        if use_cache:
            cfg = self.config
            cache = KVCache(
                cfg.n_layer,
                idx.shape[0],
                cfg.n_kv_head or cfg.n_head,
                cfg.head_dim,
                idx.shape[1] + max_new_tokens,
                dtype=self.wte.weight.dtype,
                device=idx.device,
            )
        out, step_input = idx, idx
        for _ in range(max_new_tokens):
            h = self.hidden(step_input if use_cache else out, cache=cache)
            nxt = next_tokens(self.lm_head(h[:, -1]), temperature, top_k, generator)  # (B, 1)
            out = torch.cat((out, nxt), dim=1)
            step_input = nxt
        return out
