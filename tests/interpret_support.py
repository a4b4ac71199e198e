"""Why a test of SGLang's kernels through Triton's CPU interpreter cannot run here (``""``: it
can), for `tests/conformance/test_interpret.py` and `test_speculative.py`. The interpreter needs
triton, the fetched kernel files, no CUDA device (the GPU twin runs there),
``TRITON_INTERPRET=1`` before triton is imported (`tests/conformance/conftest.py`) and numpy < 2
(Triton 3.6's interpreter converts one-element arrays to ints, which numpy 2 refuses)."""

from __future__ import annotations

import importlib.util
import os

from warpolicy.conformance import wheels


def why_interpreter_skips(gpu_twin: str) -> str:
    """The skip reason, naming ``gpu_twin`` (the test file that runs the same on a GPU)."""
    if importlib.util.find_spec("triton") is None:
        return "needs triton (pip install triton==3.6.0; not a project dependency)"
    reason = wheels.absent_reason()
    if reason is not None:
        return reason
    import torch

    if torch.cuda.is_available():
        return f"CUDA is available: {gpu_twin} runs the kernels there"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return (
            "triton was imported before TRITON_INTERPRET=1 could be set (see "
            "tests/conformance/conftest.py); run: TRITON_INTERPRET=1 pytest tests/conformance"
        )
    if importlib.util.find_spec("numpy") is None:
        return "Triton's interpreter needs numpy"
    import numpy as np

    if int(np.__version__.split(".")[0]) >= 2:
        return "Triton 3.6's interpreter needs numpy < 2 (it converts 1-element arrays to int)"
    return ""
