"""Set-up shared by every test module.

``TRITON_INTERPRET`` is read once, when triton first decorates a kernel, so it must be set before
any test module (or a library it imports, such as transformers) imports triton. Without a GPU the
Triton kernels then run in triton's interpreter on CPU tensors; with one they compile for it.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
