"""GPU code paths traced without a GPU: device placement, host syncs, layouts and dtypes.

A model built on the ``meta`` device runs every op of its forward and backward without data, so
the device of every tensor an op touches can be checked: a table built on the CPU, or a
host -> device copy on the hot path, shows up as a CPU tensor meeting meta ones (on CUDA that is
a blocking copy per forward and decoded token). ``.item()`` and other host reads raise on meta.

Run: pytest tests/test_device_tracing.py
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from rove.kernels import use_backend
from rove.model import GPT, get_preset
from rove.rotary import Rotary


class DeviceLog(TorchDispatchMode):
    """Record every op whose tensor inputs or outputs are not all on one device."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.offenders: list[str] = []
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(str(func))
        devices = {
            t.device for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)
        }
        if devices - {self.device}:
            self.offenders.append(f"{func} touched {sorted(map(str, devices))}")
        return out


def meta_model(pos: str, **kw) -> GPT:
    """Built on the CPU and moved, as a model is moved to the GPU."""
    return GPT(get_preset("nano", vocab_size=64, pos=pos, **kw)).to("meta")


@pytest.mark.parametrize("pos", ["rope", "rove"])
@pytest.mark.parametrize("variant", [{}, {"shared_kv": True, "n_kv_head": 1, "rotary_dim": 8}])
def test_forward_backward_stays_on_device(pos, variant):
    """Forward and backward of a rotary model touch no tensor off the model's device."""
    model = meta_model(pos, **variant)
    idx = torch.zeros(2, 16, dtype=torch.long, device="meta")
    with DeviceLog("meta") as log:
        loss = model(idx, idx)
        loss.backward()
    assert loss.device.type == "meta"
    assert log.offenders == []


@pytest.mark.parametrize("pos", ["rope", "rove"])
def test_triton_path_traces_on_meta(pos):
    """The Triton ops (interpreted, launches skipped on data-less tensors) compose through a
    bf16 model's forward and backward on meta: shapes, strides, dtypes and devices line up."""
    pytest.importorskip("triton")
    model = meta_model(pos).to(torch.bfloat16)
    idx = torch.zeros(2, 16, dtype=torch.long, device="meta")
    with use_backend("triton"), DeviceLog("meta") as log:
        loss = model(idx, idx)
        loss.backward()
    assert log.offenders == []
    assert any("rove." in op for op in log.ops)  # the custom ops ran
    assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters())


def test_decoding_with_a_cache_stays_on_device():
    """Each decoded token (KV cache, an offset position) touches no tensor off the device."""
    from rove.kv_cache import KVCache

    model = meta_model("rove")
    cfg = model.config
    cache = KVCache(cfg.n_layer, 1, cfg.n_kv_head or cfg.n_head, cfg.head_dim, 8, device="meta")
    with torch.no_grad():
        model.hidden(torch.zeros(1, 4, dtype=torch.long, device="meta"), cache=cache)
        with DeviceLog("meta") as log:
            model.hidden(torch.zeros(1, 1, dtype=torch.long, device="meta"), cache=cache)
    assert log.offenders == []


def test_rotary_tables_follow_the_positions_device():
    """Tables are built where the positions are, from frequencies cached on that device."""
    rot = Rotary(16)
    positions = torch.arange(8, device="meta")
    rot.tables(positions)  # the one copy of the frequencies to the device
    with DeviceLog("meta") as log:
        cos, sin = rot.tables(positions + 8)
        rot.tables(positions[None])
    assert (cos.device.type, sin.device.type, cos.shape) == ("meta", "meta", (8, 8))
    assert log.offenders == []
    # the CPU frequencies still serve CPU positions, exactly as before
    cpu_cos, _ = rot.tables(torch.arange(3))
    expected = torch.cos(
        torch.arange(3.0, dtype=torch.float64)[:, None] * rot.frequencies().inv_freq
    )
    torch.testing.assert_close(cpu_cos, expected.float(), rtol=0, atol=0)


def test_compiled_model_does_not_recompile():
    """The per-device frequencies are in place before the first compiled call (guards hold)."""
    import torch._dynamo

    torch._dynamo.reset()  # another test's compiled GPT.forward (other shapes) is not a recompile
    model = GPT(get_preset("nano", vocab_size=64, pos="rove")).to("cpu")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    idx = torch.zeros(2, 16, dtype=torch.long)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            compiled(idx, idx).backward()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pos", ["rope", "rove"])
def test_steady_state_step_makes_no_host_sync(pos):
    """Forward, backward and a fused AdamW step on CUDA, then a decoded token, after warm-up:
    with ``set_sync_debug_mode("error")`` any blocking host <-> device copy or sync raises.

    (``rove.train.train_step`` reads the loss and gradient norm with ``.item()`` once per
    optimizer step on purpose, to stop on non-finite values; that read is not in here.)
    """
    from rove.kv_cache import KVCache

    torch.manual_seed(0)
    model = GPT(get_preset("nano", vocab_size=64, pos=pos)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    idx = torch.randint(0, 64, (2, 32), device="cuda")
    cfg = model.config
    cache = KVCache(cfg.n_layer, 1, cfg.n_kv_head or cfg.n_head, cfg.head_dim, 16, device="cuda")

    def train_step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, idx)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def decode() -> None:
        with torch.no_grad():
            model.hidden(idx[:1, :1], cache=cache)

    train_step()  # warm-up: allocator, kernels, optimizer state
    model.hidden(idx[:1, :4], cache=cache)
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        train_step()
        train_step()
        decode()
        decode()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
