"""``rove generate PATH --prompt ...``: sample from a run folder or an exported HF folder, streamed.

Both kinds of folder decode with a KV cache (rove's ``KVCache`` of rotated keys and values, or
the HF model's cache) and share one sampler: temperature, then top-k, then top-p (nucleus)
filtering; temperature 0 is greedy. The prompt is preceded by the end-of-text token, the
document start the model was trained with, and generation stops at the next one. Text is written
as soon as it decodes to whole characters (a byte-level token can end mid-character).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import torch

from rove.precision import resolve_device
from rove.terminal import USER_ERRORS, DefaultsFormatter, command, signature_defaults

if TYPE_CHECKING:
    from rove.model import GPT

__all__ = ["filter_logits", "generate_text", "main", "sample_next"]

Step = Callable[[torch.Tensor], torch.Tensor]  # ids (1, T) -> next-token logits (V,)


def filter_logits(
    logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """``logits`` ``(V,)`` with everything outside the top-k and the top-p nucleus set to -inf.

    The nucleus is the smallest set of most likely tokens whose probability reaches ``top_p``.
    """
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, order = torch.sort(logits, descending=True)
        before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)
        drop = torch.zeros_like(logits, dtype=torch.bool)
        drop[order] = before >= top_p  # mass of the better tokens already reaches top_p
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> int:
    """Next token id from ``logits`` ``(V,)``: argmax at temperature 0, else a filtered sample."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    logits = logits.float()
    if temperature == 0:
        return int(logits.argmax())
    probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _rove_steps(model: GPT, max_len: int) -> Step:
    """Cached next-token logits of a rove ``GPT`` (first call: the prompt, then one token)."""
    from rove.kv_cache import KVCache

    cfg = model.config
    weight = model.wte.weight
    cache = KVCache(
        cfg.n_layer,
        1,
        cfg.n_kv_head or cfg.n_head,
        cfg.head_dim,
        max_len,
        dtype=weight.dtype,
        device=weight.device,
    )

    def step(ids: torch.Tensor) -> torch.Tensor:
        return model.lm_head(model.hidden(ids.to(weight.device), cache=cache)[0, -1])

    return step


def _hf_steps(model: torch.nn.Module) -> Step:
    """Cached next-token logits of a Hugging Face causal LM."""
    from rove.hf.modeling_rove_gpt import _CACHE_FIELD

    state: dict[str, object] = {}
    device = next(model.parameters()).device

    def step(ids: torch.Tensor) -> torch.Tensor:
        out = model(ids.to(device), use_cache=True, **state)
        state[_CACHE_FIELD] = getattr(out, _CACHE_FIELD)
        return out.logits[0, -1]

    return step


def _tokens(
    step: Step,
    prompt: list[int],
    max_tokens: int,
    eot: int | None,
    sampler: Callable[[torch.Tensor], int],
    vocab: int,
) -> Iterator[int]:
    """Sampled ids until ``eot``; only the tokenizer's ``vocab`` ids (the model's vocabulary can
    be padded beyond it, e.g. to a multiple of 64)."""
    ids = [prompt]
    for _ in range(max_tokens):
        token = sampler(step(torch.tensor(ids, dtype=torch.long))[:vocab])
        if token == eot:
            return
        yield token
        ids = [[token]]


def generate_text(
    path: str | Path,
    prompt: str,
    *,
    max_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    yarn_factor: float | None = None,
    seed: int | None = None,
    device: str = "cpu",
    out: TextIO | None = None,
) -> str:
    """Sample a continuation of ``prompt`` from a run/checkpoint or export folder at ``path``.

    Pieces of text are written to ``out`` (when given) as they are decoded; returns the whole
    continuation. ``yarn_factor`` (> 1) applies YaRN relative to the training context (run
    folders of rotary models).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if yarn_factor is not None and yarn_factor <= 1:
        raise ValueError(f"yarn_factor must be > 1, got {yarn_factor}")
    sample_next(torch.zeros(2), temperature, top_k, top_p)  # bad settings fail before loading
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(seed)

    def sampler(logits: torch.Tensor) -> int:
        return sample_next(logits, temperature, top_k, top_p, generator)

    folder = Path(path)
    with torch.inference_mode():
        if _is_export(folder):
            if yarn_factor is not None:
                raise ValueError(
                    "--yarn-factor needs a run folder; an export's config.json fixes its "
                    "position encoding"
                )
            from transformers import PreTrainedTokenizerFast

            from rove.hf.export import load_exported

            model = load_exported(folder).to(device).eval()
            tok = PreTrainedTokenizerFast.from_pretrained(folder)
            eot = tok.eos_token_id
            ids = [eot] * (eot is not None) + tok(prompt, add_special_tokens=False)["input_ids"]
            step, decode = _hf_steps(model), tok.decode
            tokens = _tokens(step, ids, max_tokens, eot, sampler, len(tok))
            return _stream(tokens, decode, out)
        from rove.checkpoint import load_model
        from rove.data import checkpoint_tokenizer

        model, meta = load_model(folder, device=device)
        rove_tok = checkpoint_tokenizer(meta, f"checkpoint {folder}")
        ids = [rove_tok.eot_token, *rove_tok.encode(prompt)]
        if yarn_factor is not None and model.rotary is None:
            raise ValueError(f"--yarn-factor needs a rotary model; this one is {model.config.pos}")
        with model.rope_scaling("yarn" if yarn_factor else None, yarn_factor or 1.0):
            step = _rove_steps(model, len(ids) + max_tokens)
            eot, vocab = rove_tok.eot_token, rove_tok.vocab_size
            tokens = _tokens(step, ids, max_tokens, eot, sampler, vocab)
            return _stream(tokens, rove_tok.decode, out)


def _is_export(folder: Path) -> bool:
    """An HF model folder (its ``config.json`` names a ``model_type``), not a run folder (whose
    ``config.json`` is the training recipe)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config


def _stream(tokens: Iterator[int], decode: Callable[[list[int]], str], out: TextIO | None) -> str:
    """Decode ``tokens`` as they come; write only text that ends in a whole character."""
    ids: list[int] = []
    shown = ""
    for token in tokens:
        ids.append(token)
        text = decode(ids)
        if not text.endswith("\ufffd") and len(text) > len(shown):
            if out is not None:
                out.write(text[len(shown) :])
                out.flush()
            shown = text
    text = decode(ids)
    if out is not None and len(text) > len(shown):
        out.write(text[len(shown) :])
        out.flush()
    return text


@command("rove generate")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rove generate",
        description="Sample text from a run folder, checkpoint or exported HF folder; the "
        "continuation is streamed to stdout.",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument("path", help="run folder, checkpoint folder, or `rove export` folder")
    parser.add_argument("--prompt", required=True, help="text to continue")
    parser.add_argument("--max-tokens", type=int, help="new tokens at most")
    parser.add_argument("--temperature", type=float, help="0 = greedy")
    parser.add_argument("--top-k", type=int, help="sample from the k most likely")
    parser.add_argument("--top-p", type=float, help="sample from the top-p probability nucleus")
    parser.add_argument(
        "--yarn-factor",
        type=float,
        default=None,
        help="YaRN context extension factor over the training length (run folders)",
    )
    parser.add_argument("--seed", type=int, help="random seed for sampling")
    parser.add_argument("--device", default="auto", help="auto (the GPU if any), cpu or cuda")
    sampling = ("max_tokens", "temperature", "top_k", "top_p", "seed")
    parser.set_defaults(**signature_defaults(generate_text, *sampling))
    args = parser.parse_args(argv)
    try:
        generate_text(
            args.path,
            args.prompt,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            yarn_factor=args.yarn_factor,
            seed=args.seed,
            device=resolve_device(args.device),
            out=sys.stdout,
        )
    except USER_ERRORS:
        print(flush=True)  # end the streamed line before the error line
        raise
    print()
    return 0
