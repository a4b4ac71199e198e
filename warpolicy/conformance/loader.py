"""Load SGLang's kernels by file path, behind minimal shims (no server stack, no sgl-kernel).

`load_kernels()` returns the four kernels the conformance suite runs, from the files
``scripts/fetch-sglang-kernels`` extracted (`warpolicy.conformance.wheels`):

* 0.5.10.post1 ``sglang/srt/layers/attention/utils.py``: ``create_flashinfer_kv_indices_triton``;
* 0.5.10.post1 ``sglang/srt/layers/attention/triton_ops/decode_attention.py``:
  ``decode_attention_fwd``;
* 0.5.23 ``sglang/kernels/ops/attention/trtllm_mha_graph_metadata.py``:
  ``update_trtllm_mha_graph_metadata``;
* 0.5.23 ``sglang/kernels/ops/attention/trtllm_mha_page_table.py``:
  ``build_trtllm_mha_page_table``.

A plain ``import sglang...`` would run ``sglang/__init__.py`` and ``sglang.srt.utils.common``
(orjson, starlette, pydantic, IPython, ...). Instead the loader puts empty *shim* packages for
``sglang`` and each parent package into ``sys.modules`` (their ``__path__`` is empty, so nothing
else of SGLang can be imported through them), a ``sglang.srt.utils`` shim with the two
functions the files import (``is_cuda``, ``is_hip``), and, only when no ``sgl_kernel`` is
installed, an ``sgl_kernel`` stub whose one function raises if called (``utils.py`` imports it
at module level on CUDA for its MLA path, which the suite never runs); then it executes each
file under its real module name. The shims stay registered (a process that loaded the kernels
has ``sglang`` in ``sys.modules``); a process that already imported a real ``sglang`` is refused.

Every pinned file's sha256 is checked before it runs. Needs torch and triton (3.6 on the lent
GPU; ``TRITON_INTERPRET=1`` runs the kernels on CPU tensors for development).
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from warpolicy.conformance import wheels
from warpolicy.errors import WarpolicyError

#: Attribute marking a module object the loader created (a shim or a stub).
SHIM_MARK = "__warpolicy_shim__"


class KernelsUnavailable(WarpolicyError):
    """The pinned SGLang files are absent or altered, or cannot be loaded (one line why)."""


@attrs.frozen
class KernelFile:
    """One file the loader executes: its wheel, module name and the names it must define."""

    wheel: wheels.PinnedWheel
    path: str  # inside the wheel
    kernels: tuple[str, ...]  # ``@triton.jit`` functions the suite launches (directly or not)
    functions: tuple[str, ...] = ()  # plain Python launchers the suite calls

    @property
    def module(self) -> str:
        return self.path[: -len(".py")].replace("/", ".")

    @property
    def pinned(self) -> wheels.PinnedFile:
        return next(f for f in self.wheel.files if f.path == self.path)

    def location(self, root: Path | None = None) -> Path:
        return wheels.file_path(self.wheel, self.pinned, root)


KERNEL_FILES: tuple[KernelFile, ...] = (
    KernelFile(
        wheels.SGLANG_0_5_10,
        "sglang/srt/layers/attention/utils.py",
        kernels=("create_flashinfer_kv_indices_triton",),
    ),
    KernelFile(
        wheels.SGLANG_0_5_10,
        "sglang/srt/layers/attention/triton_ops/decode_attention.py",
        kernels=("_fwd_kernel_stage1", "_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2"),
        functions=("decode_attention_fwd",),
    ),
    KernelFile(
        wheels.SGLANG_0_5_23,
        "sglang/kernels/ops/attention/trtllm_mha_graph_metadata.py",
        kernels=("update_trtllm_mha_graph_metadata_kernel",),
        functions=("update_trtllm_mha_graph_metadata",),
    ),
    KernelFile(
        wheels.SGLANG_0_5_23,
        "sglang/kernels/ops/attention/trtllm_mha_page_table.py",
        kernels=("create_trtllm_mha_kv_indices_triton",),
        functions=("build_trtllm_mha_page_table",),
    ),
)

#: What the shims provide: module -> names. A file importing anything else from ``sglang`` or
#: ``sgl_kernel`` (or a third-party module not listed in `ALLOWED_IMPORTS`) is refused.
SHIM_NAMES: dict[str, tuple[str, ...]] = {
    "sglang.srt.utils": ("is_cuda", "is_hip"),
    "sgl_kernel": ("concat_mla_absorb_q",),
}
#: Modules the pinned files may import at module level besides the shims.
ALLOWED_IMPORTS = frozenset({"torch", "triton", "triton.language", "typing", "logging"})


@attrs.frozen
class ImportFact:
    """A module-level import of a pinned file (``from MODULE import NAMES`` or ``import MODULE``)."""

    module: str
    names: tuple[str, ...]
    line: int


def module_imports(source: str) -> list[ImportFact]:
    """Imports that run when the file is executed: module level, and inside module-level ``if``
    blocks (``if _is_cuda: from sgl_kernel import ...``); not those inside functions."""
    tree = ast.parse(source)
    facts: list[ImportFact] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Import):
            facts += [ImportFact(a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            facts.append(ImportFact(node.module, tuple(a.name for a in node.names), node.lineno))
        elif isinstance(node, (ast.If, ast.Try)):
            todo += list(node.body) + list(node.orelse)
            for handler in getattr(node, "handlers", ()):
                todo += list(handler.body)
    return facts


def jit_functions(source: str) -> set[str]:
    """Names of module-level functions decorated with ``triton.jit`` (or ``@jit``)."""
    found = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and any(
            _decorator_name(d).endswith("jit") for d in node.decorator_list
        ):
            found.add(node.name)
    return found


def defined_functions(source: str) -> set[str]:
    return {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return f"{_decorator_name(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def check_source(kernel_file: KernelFile, source: str) -> list[str]:
    """What the loader relies on in ``source``, one line per broken assumption: the kernels
    and launchers it needs are defined, and every module-level import is a shimmed name or an
    allowed module. Pure Python (the CPU test runs it without triton)."""
    problems = []
    where = f"{kernel_file.wheel.version}/{kernel_file.path}"
    missing_jit = sorted(set(kernel_file.kernels) - jit_functions(source))
    if missing_jit:
        problems.append(f"{where}: no @triton.jit {', '.join(missing_jit)}")
    missing_fn = sorted(set(kernel_file.functions) - defined_functions(source))
    if missing_fn:
        problems.append(f"{where}: no function {', '.join(missing_fn)}")
    for fact in module_imports(source):
        if fact.module in SHIM_NAMES:
            extra = sorted(set(fact.names) - set(SHIM_NAMES[fact.module]))
            if extra:
                problems.append(
                    f"{where}:{fact.line}: imports {', '.join(extra)} from {fact.module}, "
                    "which the shim does not provide"
                )
        elif fact.module.split(".")[0] in ("sglang", "sgl_kernel"):
            problems.append(f"{where}:{fact.line}: imports {fact.module}, which is not shimmed")
        elif fact.module not in ALLOWED_IMPORTS:
            problems.append(f"{where}:{fact.line}: imports {fact.module} (not expected)")
    return problems


# ---------------------------------------------------------------------------------------------
# Shims
# ---------------------------------------------------------------------------------------------


def _is_cuda() -> bool:
    import torch  # noqa: PLC0415 - deferred: this package imports without torch

    return bool(torch.cuda.is_available() and torch.version.cuda is not None)


def _is_hip() -> bool:
    import torch  # noqa: PLC0415 - deferred: this package imports without torch

    return bool(torch.version.hip is not None)


def _concat_mla_absorb_q(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError(
        "sgl_kernel.concat_mla_absorb_q is a warpolicy stub (sgl-kernel is not installed); "
        "the conformance suite does not run SGLang's MLA path"
    )


def _shim(name: str, **attributes: Callable[..., Any]) -> types.ModuleType:
    module = types.ModuleType(name, f"warpolicy shim for {name} (conformance loader)")
    setattr(module, SHIM_MARK, True)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def _package(name: str) -> types.ModuleType:
    module = _shim(name)
    module.__path__ = []  # a package, but nothing on disk: submodules only when registered
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    return module


def install_shims() -> None:
    """Register the shim packages and modules in ``sys.modules`` (idempotent).

    Raises `KernelsUnavailable` when a real ``sglang`` is already imported in this process.
    """
    existing = sys.modules.get("sglang")
    if existing is not None and not getattr(existing, SHIM_MARK, False):
        raise KernelsUnavailable(
            "a real sglang package is already imported in this process; the conformance "
            "loader loads single files behind its own shims and will not mix them"
        )
    packages = {
        ".".join(parts[:i])
        for f in KERNEL_FILES
        for parts in [f.module.split(".")]
        for i in range(1, len(parts))
    }
    for name in sorted(packages, key=lambda n: n.count(".")):
        if name not in sys.modules:
            sys.modules[name] = _package(name)
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, sys.modules[name])
    if "sglang.srt.utils" not in sys.modules:
        utils = _shim("sglang.srt.utils", is_cuda=_is_cuda, is_hip=_is_hip)
        sys.modules["sglang.srt.utils"] = utils
        sys.modules["sglang.srt"].utils = utils  # type: ignore[attr-defined]
    if "sgl_kernel" not in sys.modules and importlib.util.find_spec("sgl_kernel") is None:
        sys.modules["sgl_kernel"] = _shim("sgl_kernel", concat_mla_absorb_q=_concat_mla_absorb_q)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class SGLangKernels:
    """The loaded kernels (the launchers SGLang's backends call) and their modules."""

    create_flashinfer_kv_indices_triton: Any  # Triton JIT function: launch as ``fn[grid](...)``
    decode_attention_fwd: Callable[..., None]
    update_trtllm_mha_graph_metadata: Callable[..., None]
    build_trtllm_mha_page_table: Callable[..., None]
    q_mode_none: int  # ``Q_MODE_NONE`` of trtllm_mha_graph_metadata (cu_seqlens_q preset)
    #: ``Q_MODE_STRIDED`` (``cu_seqlens_q[1:] = arange * q_stride``: DRAFT_EXTEND_V2)
    q_mode_strided: int
    modules: tuple[types.ModuleType, ...] = attrs.field(repr=False)
    root: Path = attrs.field(repr=False)


_LOCK = threading.Lock()
_LOADED: dict[Path, SGLangKernels] = {}


def load_kernels(root: Path | None = None) -> SGLangKernels:
    """Load (once per folder and process) the four kernels from the extracted pinned files.

    Raises `KernelsUnavailable` (one line, naming ``scripts/fetch-sglang-kernels`` when files
    are absent) on any failure.
    """
    base = (root if root is not None else wheels.kernel_dir()).resolve()
    with _LOCK:
        if base in _LOADED:
            return _LOADED[base]
        loaded = _load(base)
        _LOADED[base] = loaded
        return loaded


def _load(base: Path) -> SGLangKernels:
    reason = wheels.absent_reason(base)
    if reason is not None:
        raise KernelsUnavailable(reason)
    for dependency in ("torch", "triton"):
        if importlib.util.find_spec(dependency) is None:
            raise KernelsUnavailable(
                f"SGLang's kernels need {dependency}, which is not installed "
                f"(pip install {'triton==3.6.0' if dependency == 'triton' else dependency})"
            )
    install_shims()
    modules = []
    for kernel_file in KERNEL_FILES:
        path = kernel_file.location(base)
        source = path.read_text(encoding="utf-8")
        problems = check_source(kernel_file, source)
        if problems:
            raise KernelsUnavailable(problems[0])
        modules.append(_exec_module(kernel_file.module, path))
    by_name = {m.__name__: m for m in modules}

    def get(module: str, name: str) -> Any:
        try:
            return getattr(by_name[module], name)
        except AttributeError:
            raise KernelsUnavailable(f"{module} defines no {name}") from None

    return SGLangKernels(
        create_flashinfer_kv_indices_triton=get(
            "sglang.srt.layers.attention.utils", "create_flashinfer_kv_indices_triton"
        ),
        decode_attention_fwd=get(
            "sglang.srt.layers.attention.triton_ops.decode_attention", "decode_attention_fwd"
        ),
        update_trtllm_mha_graph_metadata=get(
            "sglang.kernels.ops.attention.trtllm_mha_graph_metadata",
            "update_trtllm_mha_graph_metadata",
        ),
        build_trtllm_mha_page_table=get(
            "sglang.kernels.ops.attention.trtllm_mha_page_table", "build_trtllm_mha_page_table"
        ),
        q_mode_none=int(
            get("sglang.kernels.ops.attention.trtllm_mha_graph_metadata", "Q_MODE_NONE")
        ),
        q_mode_strided=int(
            get("sglang.kernels.ops.attention.trtllm_mha_graph_metadata", "Q_MODE_STRIDED")
        ),
        modules=tuple(modules),
        root=base,
    )


def _exec_module(name: str, path: Path) -> types.ModuleType:
    """Execute ``path`` as module ``name`` (registered before it runs, as an import would)."""
    existing = sys.modules.get(name)
    if existing is not None and getattr(existing, "__file__", None) == str(path):
        return existing
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise KernelsUnavailable(f"cannot load {path} as {name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure of SGLang's file is one line
        sys.modules.pop(name, None)
        raise KernelsUnavailable(
            f"loading {path} failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        ) from None
    setattr(sys.modules[parent], child, module)
    return module


__all__ = [
    "ALLOWED_IMPORTS",
    "KERNEL_FILES",
    "SHIM_NAMES",
    "ImportFact",
    "KernelFile",
    "KernelsUnavailable",
    "SGLangKernels",
    "check_source",
    "install_shims",
    "load_kernels",
    "module_imports",
]
