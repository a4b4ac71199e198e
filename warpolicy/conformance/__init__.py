"""Conformance on SGLang's real kernels: the policies, the audit, derived placement and the
capture self-check, run on kernels nobody here wrote.

* `warpolicy.conformance.wheels`: the pinned SGLang wheels (sha256) and the only files taken
  from them; ``scripts/fetch-sglang-kernels`` downloads and extracts them into ``.sglang/``;
* `warpolicy.conformance.loader`: loads ``create_flashinfer_kv_indices_triton``,
  ``decode_attention_fwd`` (0.5.10.post1), ``update_trtllm_mha_graph_metadata`` and
  ``build_trtllm_mha_page_table`` (0.5.23) by file path behind minimal shims;
* `warpolicy.conformance.paged`: SGLang-shaped scheduler state (request-to-token table, SWA
  mapping, KV pools) and a torch reference step;
* `warpolicy.conformance.adapters`: ModelAdapters calling the kernels as SGLang's triton and
  trtllm_mha backends do, and late-reader mutants;
* `warpolicy.conformance.factories`: audit subjects (``warpolicy audit --factory
  warpolicy.conformance.factories:declared``, ``:derived``, ``:mutants``, ...);
* `warpolicy.conformance.controls`: the audit poisons' positive controls (plain torch, no
  wheel needed);
* `warpolicy.conformance.speculative`: EAGLE-family steps (draft decode, target verify, draft
  extend) on trtllm_mha's kernel, unstaged and staged (``warpolicy audit --factory
  warpolicy.conformance.speculative:steps``).

Importing this package imports neither torch nor triton; `load_kernels` needs both (and the
fetched files: `absent_reason` says what to run when they are missing).
"""

from warpolicy.conformance.loader import KernelsUnavailable, SGLangKernels, load_kernels
from warpolicy.conformance.wheels import FETCH_HINT, WHEELS, absent_reason, kernel_dir

__all__ = [
    "FETCH_HINT",
    "WHEELS",
    "KernelsUnavailable",
    "SGLangKernels",
    "absent_reason",
    "kernel_dir",
    "load_kernels",
]
