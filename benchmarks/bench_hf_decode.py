"""Decoding cost of ``rove.hf.convert``: one cached step, RoPE vs RoVE, at short and long caches.

The converted model rotates each new value once before it enters HF's cache and un-rotates one
output row per step, so its extra cost per token must not grow with the cache length. Both modes
run on the same weights (``convert`` toggles hooks), interleaved round by round; compare the
extra ms per step across cache lengths: it must stay flat (a re-rotated cache would grow it).

Run:
    python benchmarks/bench_hf_decode.py                 # CPU, 1 thread, caches of 128 and 2048
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

import rove.hf


def step_ms(model, ids: torch.Tensor, prompt_len: int, steps: int) -> float:
    """Median ms of one cached decoding step after a ``prompt_len`` prefill."""
    cache = DynamicCache()
    with torch.no_grad():
        model(ids[:, :prompt_len], past_key_values=cache, use_cache=True)
        times = []
        for t in range(steps):
            start = time.perf_counter()
            pos = prompt_len + t
            model(ids[:, pos : pos + 1], past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 2048])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", FutureWarning)  # transformers 5's past_key_values rename
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max(args.lengths) + args.steps,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    ids = torch.randint(0, 1024, (1, max(args.lengths) + args.steps))
    print(f"torch {torch.__version__}, {args.threads} thread(s), Llama 4x256, fp32, SDPA")
    print("| cache length | rope ms/step | rove ms/step | rove - rope ms (median, min-max) |")
    print("|---|---|---|---|")
    for length in args.lengths:
        extra, times = [], {"rope": [], "rove": []}
        for _ in range(args.rounds):
            for pos in ("rope", "rove"):
                rove.hf.convert(model, pos)
                times[pos].append(step_ms(model, ids, length, args.steps))
            extra.append(times["rove"][-1] - times["rope"][-1])
        rope, rv = (statistics.median(times[m]) for m in ("rope", "rove"))
        print(
            f"| {length} | {rope:.2f} | {rv:.2f} | {statistics.median(extra):.2f} "
            f"({min(extra):.2f} to {max(extra):.2f}) |"
        )


if __name__ == "__main__":
    main()
