"""The Triton kernels compile to an H100/H200 binary (sm_90) without a GPU.

The interpreter (tests/test_kernels_triton.py) checks what the kernels compute, but not that the
compiler accepts them: type and layout errors in the device code surface only at compilation.
Triton ships ``ptxas``, so a CPU machine can compile for ``sm_90``; the child process runs without
``TRITON_INTERPRET`` (the kernels must be real ``@triton.jit`` functions) and with its own cache.

Run: pytest tests/test_kernels_compile.py
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

CHILD = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from rove.kernels import triton_kernels as tk

def compile_sm90(fn, **constexprs):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*fp32" if name in ("cos_ptr", "sin_ptr") else "*bf16"
        else:
            sig[name] = "i32"
    index = {(fn.arg_names.index(k),): v for k, v in constexprs.items()}
    kernel = triton.compile(ASTSource(fn, sig, constexprs=index), target=GPUTarget("cuda", 90, 32))
    assert kernel.asm["cubin"], fn

# one head of 64 channels, 48 rotated (partial rotary: the pass-through branch is compiled too)
tile = dict(HALF=24, HEAD_DIM=64, BLOCK_T=16, BLOCK_H=4, BLOCK_HALF=32, BLOCK_PASS=16)
for interleaved in (False, True):
    compile_sm90(tk._rotate_qkv_kernel, **tile, INTERLEAVED=interleaved, ROTATE_V=True)
    compile_sm90(tk._rotate_kernel, **tile, INTERLEAVED=interleaved, CONJUGATE=True)
    for rotate_v, shared_kv, has_dv in ((False, False, True), (False, True, True), (True, True, False)):
        compile_sm90(
            tk._merge_qkv_kernel, **tile, INTERLEAVED=interleaved, ROTATE_V=rotate_v,
            SHARED_KV=shared_kv, HAS_DV=has_dv,
        )
print("compiled")
"""


def test_kernels_compile_for_sm90(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    result = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    if "ptxas" in result.stderr and "not found" in result.stderr:
        pytest.skip(f"this triton has no usable ptxas: {result.stderr[-300:]}")
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
