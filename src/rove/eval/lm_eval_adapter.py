"""lm-evaluation-harness adapter: run any lm-eval task on a protocol model + tokenizer.

lm-evaluation-harness (EleutherAI) asks a model three kinds of questions through its ``LM`` interface:
``loglikelihood`` of a continuation given a context (with "is it the greedy continuation"),
``loglikelihood_rolling`` of a whole text, and ``generate_until`` a stop string. :class:`RoveLMAdapter`
answers them in plain methods on ``(context, continuation)`` tuples, texts and ``(context, gen_kwargs)``
tuples, so the request handling is tested without lm-eval installed; :func:`make_lm_eval_model` wraps an
adapter in a thin ``lm_eval.api.model.LM`` subclass, importing lm-eval only then
(``pip install rove[lm-eval]``).

Conventions: every sequence starts with the tokenizer's end-of-text token (the document boundary the
model was trained with; it also gives an empty context a first token to predict from). Contexts longer
than ``max_length`` (default ``block_size``) lose their oldest tokens. Rolling log-likelihoods use
disjoint windows of ``max_length`` predicted tokens, each conditioned only on its own window (and the
token before it). Generation uses the model's KV-cached ``generate``, one request at a time, and cuts the
text at the first stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from rove.eval.protocol import LanguageModel, Tokenizer
from rove.eval.scoring import encode_pair, model_device, score_continuations

__all__ = ["RoveLMAdapter", "make_lm_eval_model"]


class RoveLMAdapter:
    """lm-eval request handling for a :class:`~rove.eval.protocol.LanguageModel`."""

    def __init__(
        self,
        model: LanguageModel,
        tokenizer: Tokenizer,
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
        pairs = []
        for context, continuation in requests:
            ctx, cont = encode_pair(self.tokenizer, context, continuation)
            pairs.append((bos + ctx, cont))
        scores = score_continuations(
            self.model,
            pairs,
            batch_size=self.batch_size,
            max_len=self.max_length,
            greedy=True,
            progress=progress,
        )
        return [(-s.nll_sum, bool(s.greedy)) for s in scores]

    def loglikelihood_rolling_texts(
        self, texts: Sequence[str], progress: bool = False
    ) -> list[float]:
        """Total log-likelihood of each text (all its tokens), over disjoint ``max_length`` windows."""
        pairs, owner = [], []
        for i, text in enumerate(texts):
            seq = [self.tokenizer.eot_token, *self.tokenizer.encode(text)]
            for start in range(0, len(seq) - 1, self.max_length):
                end = min(start + self.max_length, len(seq) - 1)
                pairs.append((seq[start : start + 1], seq[start + 1 : end + 1]))
                owner.append(i)
        scores = score_continuations(
            self.model,
            pairs,
            batch_size=self.batch_size,
            max_len=self.max_length,
            progress=progress,
        )
        totals = [0.0] * len(texts)
        for i, s in zip(owner, scores, strict=True):
            totals[i] -= s.nll_sum
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
            text = self.tokenizer.decode(out[0, len(ids) :].tolist())
            cuts = [text.find(s) for s in until if s and s in text]
            outputs.append(text[: min(cuts)] if cuts else text)
        return outputs


def make_lm_eval_model(model: LanguageModel, tokenizer: Tokenizer, **adapter_kwargs: Any) -> Any:
    """An ``lm_eval.api.model.LM`` instance for ``lm_eval.simple_evaluate(model=...)``.

    ``adapter_kwargs`` go to :class:`RoveLMAdapter` (batch_size, max_length, max_gen_toks).
    """
    try:
        from lm_eval.api.model import LM
    except ImportError as err:
        raise ImportError(
            "lm-evaluation-harness is not installed; install the optional extra: "
            "pip install rove[lm-eval]"
        ) from err

    adapter = RoveLMAdapter(model, tokenizer, **adapter_kwargs)

    class RoveLM(LM):  # type: ignore[misc, valid-type]
        """Thin lm-eval wrapper; requests carry their arguments in ``.args``."""

        def __init__(self) -> None:
            super().__init__()
            self.adapter = adapter

        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
            return adapter.loglikelihood_pairs([r.args for r in requests], not disable_tqdm)

        def loglikelihood_rolling(
            self, requests: list[Any], disable_tqdm: bool = False
        ) -> list[Any]:
            return adapter.loglikelihood_rolling_texts(
                [r.args[0] for r in requests], not disable_tqdm
            )

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            return adapter.generate_texts([r.args for r in requests], not disable_tqdm)

    return RoveLM()
