"""``rove generate PATH --prompt ...``: sample from a run folder or an exported HF folder, streamed.

A run folder decodes with rove's ``KVCache`` of rotated keys and values, grown as tokens come (so
a large ``--max-tokens`` costs memory only for what is generated), and rove's sampler:
temperature, then top-k, then top-p (nucleus) filtering; temperature 0 is greedy. An export
folder decodes with the model's own Hugging Face ``generate`` and its ``generation_config.json``,
as any HF user would; flags given on the command line override that file. The prompt is preceded
by the end-of-text token, the document start the model was trained with, and generation stops at
the next one. Text is written as soon as it decodes to whole characters (a byte-level token can
end mid-character).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch

from rove.precision import resolve_device
from rove.rotary import SCALING_KINDS
from rove.sampling import filter_logits, sample_next
from rove.terminal import (
    USER_ERRORS,
    DefaultsFormatter,
    DeprecatedFlag,
    command,
    signature_defaults,
)

if TYPE_CHECKING:
    from rove.kv_cache import KVCache
    from rove.model import GPT

__all__ = [
    "Sampling",
    "filter_logits",
    "generate_samples",
    "generate_text",
    "hf_export_type",
    "main",
    "refuse_export",
    "sample_next",
    "usable_device",
]

Step = Callable[[torch.Tensor], torch.Tensor]  # ids (1, T) -> next-token logits (V,)

DEFAULT_MAX_TOKENS = 200  # a run folder's default, and an export's when its config sets none
DEFAULT_TEMPERATURE = 0.8  # a run folder's default (an export's comes from its config)
CACHE_CHUNK = 1024  # positions a run folder's cache grows by at least
SAMPLE_SEPARATOR = "\n---\n"  # between the samples of --num-samples


@dataclass(frozen=True)
class Sampling:
    """What to sample; None = the folder's default (rove's for a run, the export's
    ``generation_config.json``). Checked on creation, before any model loads."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature is not None:
            sample_next(torch.zeros(2), self.temperature)
        if self.top_k is not None or self.top_p is not None:
            filter_logits(torch.zeros(2), self.top_k, self.top_p)


def usable_device(name: str) -> torch.device:
    """``name`` as a device torch can allocate on here, else one line saying why not."""
    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:  # AssertionError: torch built without CUDA
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"device {name!r} cannot be used here ({why}); use auto, cpu or cuda"
        ) from None
    return device


class _TextOut:
    """Tokens in, text out: writes only text that ends in a whole character."""

    def __init__(self, decode: Callable[[list[int]], str], out: TextIO | None) -> None:
        self.decode, self.out = decode, out
        self.ids: list[int] = []
        self.shown = ""

    def add(self, token: int) -> None:
        self.ids.append(token)
        text = self.decode(self.ids)
        if not text.endswith("\ufffd") and len(text) > len(self.shown):
            self._write(text)

    def finish(self) -> str:
        text = self.decode(self.ids)
        if len(text) > len(self.shown):
            self._write(text)
        return text

    def _write(self, text: str) -> None:
        if self.out is not None:
            self.out.write(text[len(self.shown) :])
            self.out.flush()
        self.shown = text


def _grown_cache(model: GPT, old: KVCache | None, capacity: int) -> KVCache:
    """A cache of ``capacity`` positions holding ``old``'s filled ones."""
    from rove.kv_cache import KVCache

    cfg, weight = model.config, model.wte.weight
    n_kv = cfg.n_kv_head or cfg.n_head
    new = KVCache(
        cfg.n_layer, 1, n_kv, cfg.head_dim, capacity, dtype=weight.dtype, device=weight.device
    )
    if old is not None:
        new.k[..., : old.length, :] = old.k[..., : old.length, :]
        new.v[..., : old.length, :] = old.v[..., : old.length, :]
        new.length = old.length
    return new


def _rove_steps(model: GPT, max_len: int) -> Step:
    """Cached next-token logits of a rove ``GPT`` (first call: the prompt, then one token). The
    cache grows (at least doubling) up to ``max_len`` positions as it fills, never allocated
    for the whole budget up front."""
    cache: KVCache | None = None

    def step(ids: torch.Tensor) -> torch.Tensor:
        nonlocal cache
        need = (cache.length if cache is not None else 0) + ids.shape[1]
        if cache is None or need > cache.capacity:
            old = cache.capacity if cache is not None else 0
            cache = _grown_cache(model, cache, min(max_len, max(need + CACHE_CHUNK, 2 * old)))
        return model.lm_head(model.hidden(ids.to(model.wte.weight.device), cache=cache)[0, -1])

    return step


def _rove_sample(
    step: Step,
    prompt: list[int],
    max_tokens: int,
    eot: int,
    sampler: Callable[[torch.Tensor], int],
    vocab: int,
    text: _TextOut,
) -> str:
    """Sample until ``eot``, from the tokenizer's ``vocab`` ids only (the model's vocabulary can
    be padded beyond it, e.g. to a multiple of 64)."""
    ids = [prompt]
    for _ in range(max_tokens):
        token = sampler(step(torch.tensor(ids, dtype=torch.long))[:vocab])
        if token == eot:
            break
        text.add(token)
        ids = [[token]]
    return text.finish()


def generate_text(path: str | Path, prompt: str, **kwargs: Any) -> str:
    """One sample: :func:`generate_samples` with ``num_samples=1``."""
    return generate_samples(path, prompt, num_samples=1, **kwargs)[0]


def generate_samples(
    path: str | Path,
    prompt: str,
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    scaling: str | None = None,
    scaling_factor: float | None = None,
    seed: int | None = None,
    device: str = "cpu",
    num_samples: int = 1,
    out: TextIO | None = None,
) -> list[str]:
    """``num_samples`` continuations of ``prompt`` from a run/checkpoint or export folder.

    Unset settings are the folder's defaults (see :class:`Sampling`). Text is written to ``out``
    (when given) as it is decoded, the samples separated by ``SAMPLE_SEPARATOR``.
    ``scaling`` (a kind of ``rove.rotary.SCALING_KINDS``) with ``scaling_factor`` (> 1) extends
    a rotary model's context at inference time, relative to the training length (run folders).
    Everything is checked before the model loads.
    """
    sampling = Sampling(max_tokens, temperature, top_k, top_p)
    if (scaling is None) != (scaling_factor is None):
        raise ValueError("--scaling KIND and --scaling-factor F go together")
    if scaling is not None and scaling not in SCALING_KINDS:
        raise ValueError(f"unknown scaling {scaling!r}; choose from {', '.join(SCALING_KINDS)}")
    if scaling_factor is not None and not scaling_factor > 1:
        raise ValueError(f"scaling_factor must be > 1, got {scaling_factor}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if seed is not None and not -(2**63) <= seed < 2**64:  # torch's range: it overflows past it
        raise ValueError(f"seed must be in [-2**63, 2**64) (a 64-bit seed), got {seed}")
    dev = usable_device(device)
    folder = Path(path)
    if hf_export_type(folder) is not None:
        if scaling is not None:
            raise ValueError(
                "--scaling needs a run folder; an export's config.json fixes its position encoding"
            )
        return _export_samples(folder, prompt, sampling, seed, dev, num_samples, out)
    scaled = None if scaling is None or scaling_factor is None else (scaling, scaling_factor)
    return _run_samples(folder, prompt, sampling, scaled, seed, dev, num_samples, out)


def _separate(out: TextIO | None, i: int) -> None:
    if out is not None and i:
        out.write(SAMPLE_SEPARATOR)


def _run_samples(
    folder: Path,
    prompt: str,
    sampling: Sampling,
    scaled: tuple[str, float] | None,
    seed: int | None,
    device: torch.device,
    num_samples: int,
    out: TextIO | None,
) -> list[str]:
    from rove.checkpoint import load_model
    from rove.data import checkpoint_tokenizer

    model, meta = load_model(folder, device=str(device))
    tok = checkpoint_tokenizer(meta, f"checkpoint {folder}")
    ids = [tok.eot_token, *tok.encode(prompt)]
    max_tokens = sampling.max_tokens or DEFAULT_MAX_TOKENS
    if model.config.pos == "learned" and len(ids) + max_tokens > model.config.block_size:
        raise ValueError(
            f"the prompt ({len(ids)} tokens with the start token) and {max_tokens} new tokens "
            f"exceed this model's {model.config.block_size} learned positions; lower --max-tokens"
        )
    if scaled is not None and model.rotary is None:
        raise ValueError(f"--scaling needs a rotary model; this one is {model.config.pos}")
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(seed)
    temperature = DEFAULT_TEMPERATURE if sampling.temperature is None else sampling.temperature

    def sampler(logits: torch.Tensor) -> int:
        return sample_next(logits, temperature, sampling.top_k, sampling.top_p, generator)

    texts = []
    with (
        torch.inference_mode(),
        model.rope_scaling(*(scaled or (None, 1.0))),
    ):
        for i in range(num_samples):
            _separate(out, i)
            step = _rove_steps(model, len(ids) + max_tokens)
            text = _TextOut(tok.decode, out)
            texts.append(
                _rove_sample(step, ids, max_tokens, tok.eot_token, sampler, tok.vocab_size, text)
            )
    return texts


def _export_samples(
    folder: Path,
    prompt: str,
    sampling: Sampling,
    seed: int | None,
    device: torch.device,
    num_samples: int,
    out: TextIO | None,
) -> list[str]:
    """Samples from the export's HF ``generate``, with its ``generation_config.json`` and the
    command line's settings over it."""
    from transformers import PreTrainedTokenizerFast
    from transformers.generation.streamers import BaseStreamer

    from rove.hf.export import load_exported
    from rove.terminal import no_progress_bars

    with no_progress_bars():
        model = load_exported(folder).to(device).eval()
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    config = model.generation_config
    eos = config.eos_token_id if config.eos_token_id is not None else tok.eos_token_id
    start = [eos] if isinstance(eos, int) else []
    ids = torch.tensor([start + tok(prompt, add_special_tokens=False)["input_ids"]], device=device)
    settings: dict[str, Any] = {
        "max_new_tokens": sampling.max_tokens or config.max_new_tokens or DEFAULT_MAX_TOKENS
    }
    positions = _position_table_rows(model.config)
    if positions is not None and ids.shape[1] + settings["max_new_tokens"] > positions:
        raise ValueError(
            f"the prompt ({ids.shape[1]} tokens with the start token) and "
            f"{settings['max_new_tokens']} new tokens exceed this model's {positions} positions; "
            "lower --max-tokens"
        )
    if sampling.temperature is not None:
        settings["do_sample"] = sampling.temperature > 0
        if sampling.temperature > 0:
            settings["temperature"] = sampling.temperature
    settings |= {k: v for k, v in (("top_k", sampling.top_k), ("top_p", sampling.top_p)) if v}
    config = copy.deepcopy(config)
    config.update(**settings)  # the command line over the file
    stops = {eos} if isinstance(eos, int) else set(eos or ())

    class Streamer(BaseStreamer):  # HF calls put() with the prompt, then each new token
        def __init__(self, text: _TextOut) -> None:
            self.text, self.prompt_seen = text, False

        def put(self, value: torch.Tensor) -> None:
            if not self.prompt_seen:
                self.prompt_seen = True
                return
            for token in value.flatten().tolist():
                if token not in stops:
                    self.text.add(token)

        def end(self) -> None:
            pass

    texts = []
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.inference_mode():
        if seed is not None:
            torch.manual_seed(seed)
        for i in range(num_samples):
            _separate(out, i)
            text = _TextOut(tok.decode, out)
            with _past_training_length_is_expected(positions is None):
                model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),  # no padding (transformers 4 asks)
                    generation_config=config,
                    streamer=Streamer(text),
                )
            texts.append(text.finish())
    return texts


def _position_table_rows(config: Any) -> int | None:
    """Rows of the export's position table, the end of the positions it can embed; None where
    positions are computed (rotary, NoPE in rove's modeling file), so generation may run past
    the training length. Learned and NoPE stock exports are GPT2LMHeadModel (``n_positions``
    rows); rove's modeling file has a table for ``pos="learned"`` only."""
    if getattr(config, "pos", None) == "learned":
        return int(config.block_size)
    rows = getattr(config, "n_positions", None)
    return None if rows is None else int(rows)


class _DropLengthReminder(logging.Filter):
    """Drops transformers' "friendly reminder" that generation passed ``max_position_embeddings``
    (for a model with computed positions that is the training length, not a limit)."""

    dropped = False

    def filter(self, record: logging.LogRecord) -> bool:
        reminder = "the model's predefined maximum length" in record.getMessage()
        self.dropped |= reminder
        return not reminder


@contextlib.contextmanager
def _past_training_length_is_expected(expected: bool) -> Iterator[None]:
    """While generating: silence the length reminder when ``expected`` (nothing else)."""
    if not expected:
        yield
        return
    from transformers.utils import logging as hf_logging

    logger = logging.getLogger("transformers.generation.stopping_criteria")
    drop = _DropLengthReminder()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
        if drop.dropped:  # transformers logs it once per process: let a later generate say it
            hf_logging.warning_once.cache_clear()


def hf_export_type(folder: str | Path) -> str | None:
    """The ``model_type`` of an HF model folder such as ``rove export`` writes, else None (a run
    folder's ``config.json`` is its training recipe, with no ``model_type``)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return str(model_type) if model_type else None


def refuse_export(folder: str | Path, command: str, why: str) -> None:
    """One line for a command that reads run/checkpoint folders only, given an export."""
    model_type = hf_export_type(folder)
    if model_type is not None:
        raise ValueError(
            f"{folder} is a Hugging Face export (model_type {model_type!r}), not a run or "
            f"checkpoint folder: {command} {why}; give the run it was exported from"
        )


def _read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """The prompt text: ``--prompt TEXT``, ``--prompt -`` (stdin) or ``--prompt-file PATH``
    (``-`` = stdin); one final newline of a file or stdin is dropped, as ``$(cat FILE)`` does."""
    source = prompt_file if prompt_file is not None else prompt
    if prompt_file is None and prompt != "-":
        return str(prompt)
    if source == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(str(source)).read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"--prompt-file {source}: not UTF-8 text ({err.reason})") from None
    return text.removesuffix("\n")


@command("rove generate")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rove generate",
        description="Sample text from a run folder, checkpoint or exported HF folder; the "
        "continuation is streamed to stdout. An export samples with its HF generate and "
        "generation_config.json; the flags given override it.",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument("path", help="run folder, checkpoint folder, or `rove export` folder")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="text to continue; - reads it from stdin")
    prompt.add_argument("--prompt-file", help="file holding the text to continue (- = stdin)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        help=f"new tokens at most (default: {DEFAULT_MAX_TOKENS}, or the export's config)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        help=f"0 = greedy (default: {DEFAULT_TEMPERATURE}, or the export's config)",
    )
    parser.add_argument("--top-k", type=int, help="sample from the k most likely")
    parser.add_argument("--top-p", type=float, help="sample from the top-p probability nucleus")
    parser.add_argument(
        "--scaling",
        choices=SCALING_KINDS,
        metavar="KIND",
        help=f"inference-time scaling of a rotary run folder: {', '.join(SCALING_KINDS)}",
    )
    parser.add_argument(
        "--scaling-factor", type=float, metavar="F", help="context extension over training length"
    )
    parser.add_argument(
        "--yarn-factor", type=float, action=DeprecatedFlag, replacement="--scaling yarn "
        "--scaling-factor F",
    )  # fmt: skip
    parser.add_argument(
        "--num-samples",
        type=int,
        help=f"samples to draw, separated by a {SAMPLE_SEPARATOR.strip()} line",
    )
    parser.add_argument("--seed", type=int, help="random seed for sampling")
    parser.add_argument("--device", default="auto", help="auto (the GPU if any), cpu or cuda")
    sampling = ("max_tokens", "temperature", "top_k", "top_p", "seed", "num_samples")
    parser.set_defaults(**signature_defaults(generate_samples, *sampling))
    args = parser.parse_args(argv)
    if args.yarn_factor is not None:
        if args.scaling is not None or args.scaling_factor is not None:
            parser.error("--yarn-factor is --scaling yarn --scaling-factor F; give those alone")
        args.scaling, args.scaling_factor = "yarn", args.yarn_factor
    try:
        generate_samples(
            args.path,
            _read_prompt(args.prompt, args.prompt_file),
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            scaling=args.scaling,
            scaling_factor=args.scaling_factor,
            seed=args.seed,
            device=resolve_device(args.device),
            num_samples=args.num_samples,
            out=sys.stdout,
        )
    except USER_ERRORS:
        print(flush=True)  # end the streamed line before the error line
        raise
    print()
    return 0
