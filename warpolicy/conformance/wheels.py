"""The pinned SGLang wheels and the only files of them the conformance suite loads.

Nothing of SGLang is in this repository. ``scripts/fetch-sglang-kernels`` downloads the two
wheels below with pip (``--no-deps``), checks each wheel's sha256, and extracts exactly the
files listed here (each checked against its own sha256) into a git-ignored folder, by default
``.sglang/`` at the repository root (``$WARPOLICY_SGLANG_DIR`` overrides it)::

    .sglang/0.5.10.post1/sglang/srt/layers/attention/utils.py
    .sglang/0.5.10.post1/sglang/srt/layers/attention/triton_ops/decode_attention.py
    .sglang/0.5.10.post1/LICENSE
    .sglang/0.5.23/sglang/kernels/ops/attention/trtllm_mha_graph_metadata.py
    .sglang/0.5.23/sglang/kernels/ops/attention/trtllm_mha_page_table.py
    .sglang/0.5.23/LICENSE

(about 100 kB). `missing` says what is absent or altered; the loader refuses altered files.
Pure Python and no torch: the CPU tests and the script import it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import attrs

from warpolicy import environment

#: The folder the fetch script fills, relative to the repository root.
DEFAULT_DIR_NAME = ".sglang"
#: The one line every "files absent" message ends with.
FETCH_HINT = "run scripts/fetch-sglang-kernels (pip downloads the pinned SGLang wheels)"


@attrs.frozen
class PinnedFile:
    """One file taken from a wheel: its path inside the wheel and its sha256."""

    path: str  # inside the wheel, e.g. "sglang/srt/layers/attention/utils.py"
    sha256: str
    target: str = ""  # where it goes under the version folder (default: ``path``)

    @property
    def dest(self) -> str:
        return self.target or self.path


@attrs.frozen
class PinnedWheel:
    """A published SGLang wheel, pinned by version, file name and sha256."""

    version: str
    filename: str
    sha256: str
    files: tuple[PinnedFile, ...]
    pip_args: tuple[str, ...] = ()  # extra ``pip download`` arguments (platform tags)

    @property
    def requirement(self) -> str:
        return f"sglang=={self.version}"


SGLANG_0_5_10 = PinnedWheel(
    version="0.5.10.post1",
    filename="sglang-0.5.10.post1-py3-none-any.whl",
    sha256="a854a68b11caf6b4b55c241a44378a7cdede7ede325db85c955f131506703bc6",
    files=(
        PinnedFile(
            "sglang/srt/layers/attention/utils.py",
            "54406ee8f3d9d69c3cc0fd12ef982d121b45a3d13a95a933722bc07c7dec8564",
        ),
        PinnedFile(
            "sglang/srt/layers/attention/triton_ops/decode_attention.py",
            "d8f3921642aa11b9fbd4916f3ce4dd119b4690af2d53f726476b6a3893e02a5a",
        ),
        PinnedFile(
            "sglang-0.5.10.post1.dist-info/licenses/LICENSE",
            "",  # the license travels with the code; its bytes are not pinned
            target="LICENSE",
        ),
    ),
)

SGLANG_0_5_23 = PinnedWheel(
    version="0.5.23",
    filename="sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl",
    sha256="8d257a319395b322bb1be327d05e5528859358153c8563b04c0a4a3c8af164b6",
    files=(
        PinnedFile(
            "sglang/kernels/ops/attention/trtllm_mha_graph_metadata.py",
            "6a5014672e47157e315f3a99b5a34cac37b784f8cf901a47ad99c4e70a9f2321",
        ),
        PinnedFile(
            "sglang/kernels/ops/attention/trtllm_mha_page_table.py",
            "5e694edb464457f3bea11b10a336844a33d6ea3f7c82bdf9c15e3f0854564df8",
        ),
        PinnedFile(
            "sglang-0.5.23.dist-info/licenses/LICENSE",
            "",
            target="LICENSE",
        ),
    ),
    # a binary wheel for CPython 3.12 on manylinux_2_34 x86_64; only Python files are used
    pip_args=(
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_34_x86_64",
    ),
)

WHEELS: tuple[PinnedWheel, ...] = (SGLANG_0_5_10, SGLANG_0_5_23)


def repository_root() -> Path:
    """The source tree this package sits in (``warpolicy/..``)."""
    return Path(__file__).resolve().parents[2]


def kernel_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$WARPOLICY_SGLANG_DIR`` when set (and not blank), else ``<repository>/.sglang``."""
    given = environment.SGLANG_DIR.get(environ).strip()
    return Path(given).expanduser() if given else repository_root() / DEFAULT_DIR_NAME


def file_path(wheel: PinnedWheel, pinned: PinnedFile, root: Path | None = None) -> Path:
    """Where ``pinned`` of ``wheel`` lives once extracted."""
    return (root if root is not None else kernel_dir()) / wheel.version / pinned.dest


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def missing(root: Path | None = None) -> list[str]:
    """One line per pinned file that is absent or whose sha256 differs (empty: all present)."""
    base = root if root is not None else kernel_dir()
    problems = []
    for wheel in WHEELS:
        for pinned in wheel.files:
            path = file_path(wheel, pinned, base)
            if not path.is_file():
                problems.append(f"{path}: missing")
            elif pinned.sha256 and sha256_of(path) != pinned.sha256:
                problems.append(f"{path}: sha256 differs from the pinned {wheel.filename}")
    return problems


def absent_reason(root: Path | None = None) -> str | None:
    """None when every pinned file is present and intact; else one line saying what to run."""
    problems = missing(root)
    if not problems:
        return None
    base = root if root is not None else kernel_dir()
    first = problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
    return f"SGLang kernels not available under {base} ({first}); {FETCH_HINT}"


__all__ = [
    "DEFAULT_DIR_NAME",
    "FETCH_HINT",
    "SGLANG_0_5_10",
    "SGLANG_0_5_23",
    "WHEELS",
    "PinnedFile",
    "PinnedWheel",
    "absent_reason",
    "file_path",
    "kernel_dir",
    "missing",
    "repository_root",
    "sha256_of",
]
