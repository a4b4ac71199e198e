"""Triton's interpreter for `test_interpret.py`: ``TRITON_INTERPRET=1`` must be set before
triton is first imported (triton's own library functions, ``tl.cdiv`` among them, are built
interpreted or compiled at import), and something later in a session may import it (torch's
compiler stack does). So this directory's conftest sets it at collection, only where it can
matter: triton installed, not yet imported, and no CUDA device (where the GPU test runs the
kernels instead). CI has no triton: nothing happens there."""

from __future__ import annotations

import importlib.util
import os
import sys


def _wants_interpreter() -> bool:
    if "triton" in sys.modules or importlib.util.find_spec("triton") is None:
        return False
    try:
        import torch
    except ImportError:
        return False
    return not torch.cuda.is_available()


if _wants_interpreter():
    os.environ.setdefault("TRITON_INTERPRET", "1")
