"""Forward cost of ``rove.hf.convert`` at a real size: RoVE vs RoPE, side by side on a CPU.

The conversion runs Python hooks in every attention layer (a pre-hook reading the rotary
tables, a hook rotating the new values, a pre-hook un-rotating the output), so its cost is
measured where it counts: 30 layers, SmolLM2-135M's shape (Llama, hidden 576, GQA 9/3, head 64,
vocabulary 49152), random weights (the cost does not depend on them). One model, converted to
RoVE and back to RoPE before each timed forward (``rove.hf.convert`` only adds or removes hooks,
under a millisecond, inside both timings), timed by :func:`harness.time_interleaved` (rotating
order, paired ratios, medians and interquartile ranges) at a fixed thread count. One model, not
two: a deep copy of the same weights ran ~4% slower than the original on this project's CPU
(memory placement), which two models would have counted as RoVE's cost. The target: RoVE <= 1.05x.

Run:
    python benchmarks/bench_hf_forward.py                     # 1 thread, batch 1 x 512 and 4 x 128
    python benchmarks/bench_hf_forward.py --clock cpu         # on a machine others are using
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import rove.hf
from harness import (
    add_record_arguments,
    append_results,
    format_ratio,
    paired_ratio,
    set_threads,
    time_interleaved,
)
from rove.kernels.dispatch import rotate, unrotate_merge_heads

SMOLLM2 = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
    rope_theta=100000.0, tie_word_embeddings=True,
)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1x512", "4x128"], help="BATCHxTOKENS")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=120.0, help="per shape")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: this process's CPU time (with one thread, the work done, which a machine "
        "shared with other jobs does not inflate as it does wall time)",
    )
    add_record_arguments(parser)
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    config = LlamaConfig(**{**SMOLLM2, "num_hidden_layers": args.layers})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    lines = [
        f"Llama of SmolLM2-135M's shape, {args.layers} layers, random fp32 weights, SDPA, "
        f"{threads} thread(s), {args.clock} clock; forward only (no grad), logits included.",
        "",
        "| batch x tokens | RoPE ms | RoVE ms | RoVE / RoPE (paired) | RoVE's rotations ms |",
        "|---|---|---|---|---|",
    ]
    for shape in args.shapes:
        batch, tokens = map(int, shape.split("x"))
        ids = torch.randint(0, config.vocab_size, (batch, tokens))

        def forward(pos: str, ids: torch.Tensor = ids):
            def call() -> None:
                rove.hf.convert(model, pos)
                with torch.no_grad():
                    model(ids)

            return call

        with torch.no_grad():  # the toggle does switch: the two timed functions differ
            rope_out = rove.hf.convert(model, "rope")(ids).logits
            if torch.equal(rove.hf.convert(model, "rove")(ids).logits, rope_out):
                raise RuntimeError("converting the model did not change its output")
        timings = time_interleaved(
            {"rope": forward("rope"), "rove": forward("rove")},
            rounds=args.rounds,
            budget_s=args.budget_s,
            clock=time.process_time if args.clock == "cpu" else time.perf_counter,
        )
        ratio = paired_ratio(timings["rove"], timings["rope"])
        row = (
            f"| {shape} | {timings['rope'].summary()} | {timings['rove'].summary()} | "
            f"{format_ratio(ratio)} ({len(timings['rope'].samples)} rounds) | "
            f"{rotations_ms(config, batch, tokens, args.layers):.3g} |"
        )
        print(row, flush=True)
        lines.append(row)
    body = "\n".join(lines)
    print(body)
    append_results("HF forward cost of rove.hf.convert, 30 layers", body, "cpu", args.results)


def rotations_ms(config: LlamaConfig, batch: int, tokens: int, layers: int) -> float:
    """Milliseconds of what RoVE adds to a forward, timed alone: every layer's V rotation and
    O un-rotation (the hooks' kernels) on tensors of the forward's shapes, median of 7. Far
    below the forward's noise, so it says what the ratio above can at most be made of."""
    head = config.hidden_size // config.num_attention_heads
    angles = torch.arange(tokens)[:, None] * torch.rand(head // 2)
    cos, sin = angles.cos(), angles.sin()
    # (B, H, T, D) views of token-major storage, as the hooks see v_proj's output and o_proj's input
    values = torch.randn(batch, tokens, config.num_key_value_heads, head).transpose(1, 2)
    attn = torch.randn(batch, tokens, config.num_attention_heads, head).transpose(1, 2)

    def forward() -> None:
        for _ in range(layers):
            rotate(values, cos, sin)
            unrotate_merge_heads(attn, cos, sin)

    forward()
    samples = []
    for _ in range(7):
        start = time.perf_counter()
        forward()
        samples.append(time.perf_counter() - start)
    return 1e3 * sorted(samples)[3]


if __name__ == "__main__":
    main()
