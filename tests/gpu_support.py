"""What the GPU tests need, as pytest marks with one reason each: a CUDA device
(`NEEDS_CUDA`, which also marks the module ``cuda``), cuda-bindings for the graph walk
(`NEEDS_BINDINGS`), triton (`NEEDS_TRITON`) and SGLang's kernel files (`NEEDS_SGLANG`).
A GPU module says what it needs in one line: ``pytestmark = [*NEEDS_CUDA, NEEDS_BINDINGS]``."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from warpolicy.conformance import wheels


def importable(module: str) -> bool:
    """Whether ``module`` can be imported (a dotted name: its parent first, since looking up a
    submodule of a missing package raises)."""
    parent = module.partition(".")[0]
    return importlib.util.find_spec(parent) is not None and (
        parent == module or importlib.util.find_spec(module) is not None
    )


#: whether cuda-bindings is there (the graph walk: self-check, derived placement, the static
#: audit, rebinding restored graphs)
HAVE_BINDINGS = importable("cuda.bindings")
#: why SGLang's kernel files cannot be loaded, or None
SGLANG_ABSENT = wheels.absent_reason()

NEEDS_CUDA = (
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
)
NEEDS_BINDINGS = pytest.mark.skipif(
    not HAVE_BINDINGS,
    reason="needs cuda-bindings (the graph walk, static audit, the driver wait)",
)
NEEDS_TRITON = pytest.mark.skipif(not importable("triton"), reason="needs triton")
NEEDS_SGLANG = pytest.mark.skipif(SGLANG_ABSENT is not None, reason=SGLANG_ABSENT or "")
