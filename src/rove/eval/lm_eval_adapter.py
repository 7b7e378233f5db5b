"""lm-evaluation-harness adapter: run any lm-eval task on a protocol model + tokenizer.

lm-evaluation-harness (EleutherAI) asks a model three kinds of questions through its ``LM`` interface:
``loglikelihood`` of a continuation given a context (with "is it the greedy continuation"),
``loglikelihood_rolling`` of a whole text, and ``generate_until`` a stop string. :class:`RoveLMAdapter`
answers them in plain methods on ``(context, continuation)`` tuples, texts and ``(context, gen_kwargs)``
tuples, so the request handling is tested without lm-eval installed. lm-eval's ``rove`` model type,
:class:`rove.eval.lm_eval_model.RoveLM`, wraps one; :mod:`rove.eval.lm_eval_harness` holds the entry
points (``make_lm_eval_model``, ``rove lm-eval``). Imports run that way only: this module knows neither.

Conventions: every sequence starts with the tokenizer's end-of-text token (the document boundary the
model was trained with; it also gives an empty context a first token to predict from). Contexts longer
than ``max_length`` (default ``block_size``) lose their oldest tokens; a continuation longer than
``max_length`` is scored in pieces of ``max_length`` tokens. Rolling log-likelihoods use
disjoint windows of ``max_length`` predicted tokens, each conditioned only on its own window (and the
token before it). Generation uses the model's KV-cached ``generate``, one request at a time, and cuts the
text at the end-of-text token and at the first stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rove._extras import needs_extra
from rove.eval.protocol import LanguageModel, TextCodec
from rove.eval.scoring import encode_pair, model_device, score_continuations

with needs_extra("toolkit", __name__):
    from tqdm.auto import tqdm

__all__ = ["RoveLMAdapter"]


class RoveLMAdapter:
    """lm-eval request handling for a :class:`~rove.eval.protocol.LanguageModel`."""

    def __init__(
        self,
        model: LanguageModel,
        tokenizer: TextCodec,
        *,
        batch_size: int = 8,
        max_length: int | None = None,
        max_gen_toks: int = 256,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = model.config.block_size if max_length is None else max_length
        self.max_gen_toks = max_gen_toks

    def loglikelihood_pairs(
        self, requests: Sequence[tuple[str, str]], progress: bool = False
    ) -> list[tuple[float, bool]]:
        """``(log p(continuation | context), continuation is greedy)`` per request."""
        bos = [self.tokenizer.eot_token]
        windows = []
        for i, (context, continuation) in enumerate(requests):
            ctx, cont = encode_pair(self.tokenizer, context, continuation)
            # a continuation longer than max_length is scored in max_length pieces, each
            # conditioned on as much of what precedes it as fits
            for start in range(0, len(cont), self.max_length):
                windows.append((i, bos + ctx + cont[:start], cont[start : start + self.max_length]))
        return self._score_windows(windows, len(requests), greedy=True, progress=progress)

    def loglikelihood_rolling_texts(
        self, texts: Sequence[str], progress: bool = False
    ) -> list[float]:
        """Total log-likelihood of each text (all its tokens), over disjoint ``max_length`` windows."""
        windows = []
        for i, text in enumerate(texts):
            seq = [self.tokenizer.eot_token, *self.tokenizer.encode(text)]
            for start in range(0, len(seq) - 1, self.max_length):
                end = min(start + self.max_length, len(seq) - 1)
                windows.append((i, seq[start : start + 1], seq[start + 1 : end + 1]))
        totals = self._score_windows(windows, len(texts), greedy=False, progress=progress)
        return [total for total, _ in totals]

    def _score_windows(
        self,
        windows: Sequence[tuple[int, list[int], list[int]]],
        n: int,
        *,
        greedy: bool,
        progress: bool,
    ) -> list[tuple[float, bool]]:
        """Score ``(request, context ids, continuation ids)`` windows in batches and sum them
        per request ``0 .. n - 1``: ``(log-likelihood, every window greedy)`` (the second
        meaningful with ``greedy`` only)."""
        scores = score_continuations(
            self.model,
            [(context, continuation) for _, context, continuation in windows],
            batch_size=self.batch_size,
            max_len=self.max_length,
            greedy=greedy,
            progress=progress,
        )
        totals = [(0.0, True)] * n
        for (i, _, _), s in zip(windows, scores, strict=True):
            totals[i] = (totals[i][0] - s.nll_sum, totals[i][1] and bool(s.greedy))
        return totals

    def generate_texts(
        self, requests: Sequence[tuple[str, dict[str, Any]]], progress: bool = False
    ) -> list[str]:
        """Generated continuation of each context, cut at the first of ``gen_kwargs["until"]``.

        Supported ``gen_kwargs``: ``until`` (str or list), ``max_gen_toks``, ``do_sample``,
        ``temperature`` and ``top_k`` (sampling only when ``do_sample`` is true; greedy otherwise);
        any other argument raises ValueError rather than being silently ignored.
        """
        outputs = []
        device = model_device(self.model)
        for context, kwargs in tqdm(requests, desc="generate", disable=not progress, leave=False):
            kwargs = dict(kwargs)
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            sample = bool(kwargs.pop("do_sample", False))
            temperature = float(kwargs.pop("temperature", 0.0)) if sample else 0.0
            top_k = kwargs.pop("top_k", None) if sample else None
            top_p = kwargs.pop("top_p", None)
            if sample and top_p not in (None, 1.0):
                raise ValueError(f"top_p={top_p} sampling is not supported (use top_k)")
            if kwargs:
                raise ValueError(f"unsupported generation arguments: {sorted(kwargs)}")
            ids = [self.tokenizer.eot_token, *self.tokenizer.encode(context)]
            ids = ids[-max(1, self.max_length - max_new) :]
            idx = torch.tensor([ids], dtype=torch.long, device=device)
            with torch.inference_mode():
                out = self.model.generate(idx, max_new, temperature=temperature, top_k=top_k)
            new = out[0, len(ids) :].tolist()
            # the end-of-text token, or an id beyond the tokenizer (a padded vocabulary's tail,
            # never seen in training), ends the text, as EOS does in lm-eval's HF model
            vocab = getattr(self.tokenizer, "vocab_size", None)
            stops = [i for i, t in enumerate(new) if t == self.tokenizer.eot_token]
            stops += [i for i, t in enumerate(new) if vocab is not None and t >= vocab]
            text = self.tokenizer.decode(new[: min(stops, default=len(new))])
            cuts = [text.find(s) for s in until if s and s in text]
            outputs.append(text[: min(cuts)] if cuts else text)
        return outputs
