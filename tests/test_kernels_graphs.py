"""What ``torch.compile`` sees of the rotations: graphs that do not grow with the length, and
the dispatch path traced whole as it runs on CUDA.

A Python loop over chunks of tokens unrolls under dynamo into a graph that grows with T (minutes
of compile at GPU sizes), so the compiled rotation must be the plain elementwise formula; and
whatever the dispatcher calls to pick a backend must trace as a constant, else the compiled
model splits into several graphs on the device (torch 2.11 cannot trace ``find_spec``). The CI
job on the device's versions (``scripts/ci-device-versions.sh``) runs this file on torch 2.11.

Run: pytest tests/test_kernels_graphs.py
"""

from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch.utils._python_dispatch import TorchDispatchMode

from rove.kernels import dispatch, rotate, rotate_qkv, torch_rotary, unrotate_merge_heads
from rove.model import GPT, get_preset
from rove.rotary import Rotary

B, H, D = 2, 8, 64  # 16 rows of 64 channels: the CPU scratch holds 64 tokens of them


class GraphSizes:
    """A compile backend that records the node count of every graph, forward and backward."""

    def __init__(self) -> None:
        self.nodes: list[int] = []

    def count(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.nodes.append(len(gm.graph.nodes))
        return make_boxed_func(gm.forward)

    def backend(self) -> object:
        return aot_autograd(fw_compiler=self.count, bw_compiler=self.count)


def rotations(x: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    q, k, v = rotate_qkv(qkv, cos, sin, n_head=H, n_kv_head=H, rotate_v=True)
    return rotate(x, cos, sin), q, k, v, unrotate_merge_heads(x, cos, sin)


def graph_sizes(seq: int) -> list[int]:
    """Node counts of the compiled forward and backward of every rotation op at length ``seq``."""
    sizes = GraphSizes()
    fn = torch.compile(rotations, backend=sizes.backend(), fullgraph=True, dynamic=False)
    cos, sin = Rotary(D).tables(torch.arange(seq))
    x = torch.randn(B, H, seq, D, dtype=torch.bfloat16, requires_grad=True)
    qkv = torch.randn(B, seq, 3 * H * D, dtype=torch.bfloat16, requires_grad=True)
    outs = fn(x, qkv, cos, sin)
    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return sizes.nodes


def test_compiled_rotation_graph_does_not_grow_with_the_length():
    """bf16 on the CPU, where eager rotates 64 tokens at a time: compiled, T = 64 and T = 1024
    (one chunk and 16) make graphs of the same size."""
    short, long = graph_sizes(64), graph_sizes(1024)
    assert len(short) == 2  # one forward and one backward graph
    assert short == long


class OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def eager_ops(seq: int, device: str) -> int:
    """Ops dispatched by the rotations' forward and backward in eager bf16 at length ``seq``."""
    cos, sin = Rotary(D).tables(torch.arange(seq, device=device))
    x = torch.randn(B, H, seq, D, dtype=torch.bfloat16, device=device, requires_grad=True)
    qkv = torch.randn(B, seq, 3 * H * D, dtype=torch.bfloat16, device=device, requires_grad=True)
    with OpCount() as count:
        outs = rotations(x, qkv, cos, sin)
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return count.ops


def test_eager_rotation_on_the_device_is_a_fixed_number_of_ops():
    """Off the CPU (``meta`` stands in for CUDA) eager bf16 launches the same ops at T = 64 and
    T = 1024: no loop over chunks of tokens, whose launches would swamp the unfused baseline."""
    assert eager_ops(64, "meta") == eager_ops(1024, "meta")
    assert eager_ops(64, "cpu") < eager_ops(1024, "cpu")  # the CPU's chunks, 64 tokens each


@pytest.mark.parametrize("convention", ["half", "interleaved"])
@pytest.mark.parametrize("inverse", [False, True])
def test_formula_matches_the_chunked_cpu_path(convention, inverse, monkeypatch):
    """The formula (CUDA and compiled) and the CPU's chunked scratch agree to one bf16 rounding:
    both compute in float32 and round once."""
    x = torch.randn(B, 64, 40, D).bfloat16()  # 64 heads: chunks of 16 tokens
    cos, sin = Rotary(D, 48, convention=convention).tables(torch.arange(40))
    chunked = torch_rotary.rotate_torch(x, cos, sin, convention=convention, inverse=inverse)
    monkeypatch.setattr(torch_rotary, "_chunked_on_cpu", lambda x, ct: False)
    formula = torch_rotary.rotate_torch(x, cos, sin, convention=convention, inverse=inverse)
    ulp = torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(formula, chunked, rtol=ulp, atol=ulp)


@pytest.mark.parametrize("pos", ["rope", "rove"])
def test_model_compiles_whole_through_the_dispatch_as_on_cuda(pos, monkeypatch):
    """The dispatcher's automatic choice, with the CPU standing in for CUDA (the interpreted
    kernels run there), traces into one graph that holds the Triton ops: nothing in the choice
    breaks the graph."""
    pytest.importorskip("triton")
    from rove.kernels.triton_kernels import INTERPRETED

    if not INTERPRETED:
        pytest.skip("with a GPU the kernels are compiled: test_kernels_triton.py traces them")
    monkeypatch.setattr(dispatch, "_TRITON_DEVICES", ("cpu",))
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    model = GPT(get_preset("nano", vocab_size=64, pos=pos))
    idx = torch.zeros(2, 16, dtype=torch.long)
    torch._dynamo.reset()
    try:
        torch.compile(model, backend=record, fullgraph=True)(idx, idx)
    finally:
        torch._dynamo.reset()  # the code cached under the stand-in must not serve other tests
    assert len(graphs) == 1
    targets = {  # of the graph and its subgraphs (an autograd.Function is traced as one)
        str(node.target)
        for module in graphs[0].modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
    }
    assert any(t.startswith("rove.rotate_qkv") for t in targets), sorted(targets)
