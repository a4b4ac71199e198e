"""The pinned SGLang files and the loader's assumptions about them (CPU, no triton needed).

With the files fetched (``scripts/fetch-sglang-kernels``) each must still define the kernels
the suite launches and import nothing the shims do not provide; without them those tests skip
saying what to run. The rest checks the pins, the fetch script's extraction and the loader's
refusals on hand-made inputs.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import pathlib
import shutil
import sys
import types
import zipfile

import attrs
import pytest

from warpolicy import environment
from warpolicy.conformance import loader, wheels
from warpolicy.conformance.loader import KERNEL_FILES, KernelsUnavailable, check_source

ROOT = pathlib.Path(__file__).resolve().parents[2]
ABSENT = wheels.absent_reason()
needs_files = pytest.mark.skipif(ABSENT is not None, reason=ABSENT or "")


def load_script():
    path = ROOT / "scripts" / "fetch-sglang-kernels"
    source_loader = importlib.machinery.SourceFileLoader("fetch_sglang_kernels", str(path))
    spec = importlib.util.spec_from_loader("fetch_sglang_kernels", source_loader)
    module = importlib.util.module_from_spec(spec)
    source_loader.exec_module(module)
    return module


class TestPins:
    def test_every_wheel_and_code_file_is_pinned_by_sha256(self):
        for wheel in wheels.WHEELS:
            assert len(wheel.sha256) == 64 and int(wheel.sha256, 16) >= 0
            assert wheel.filename.startswith(f"sglang-{wheel.version}-")
            for pinned in wheel.files:
                if pinned.path.endswith(".py"):
                    assert len(pinned.sha256) == 64, pinned.path
        pinned_paths = {(f.wheel.version, f.path) for f in KERNEL_FILES}
        assert pinned_paths <= {(w.version, p.path) for w in wheels.WHEELS for p in w.files}

    def test_the_four_kernels(self):
        names = {n for f in KERNEL_FILES for n in (*f.kernels, *f.functions)}
        assert {
            "create_flashinfer_kv_indices_triton",
            "decode_attention_fwd",
            "update_trtllm_mha_graph_metadata",
            "build_trtllm_mha_page_table",
        } <= names

    def test_missing_files_name_the_script(self, tmp_path):
        problems = wheels.missing(tmp_path)
        assert len(problems) == sum(len(w.files) for w in wheels.WHEELS)
        reason = wheels.absent_reason(tmp_path)
        assert reason is not None and "scripts/fetch-sglang-kernels" in reason
        assert "\n" not in reason

    def test_the_folder_follows_the_environment(self, tmp_path):
        assert wheels.kernel_dir({environment.SGLANG_DIR.name: str(tmp_path)}) == tmp_path
        assert wheels.kernel_dir({environment.SGLANG_DIR.name: "  "}) == ROOT / ".sglang"
        assert wheels.kernel_dir({}) == ROOT / ".sglang"

    def test_loading_absent_files_is_one_line(self, tmp_path):
        with pytest.raises(KernelsUnavailable, match="scripts/fetch-sglang-kernels"):
            loader.load_kernels(tmp_path)


@needs_files
class TestPinnedFiles:
    """The fetched files (skipped, naming the script, when absent)."""

    @pytest.mark.parametrize("kernel_file", KERNEL_FILES, ids=lambda f: f.path.split("/")[-1])
    def test_defines_the_kernels_and_imports_only_what_the_shims_give(self, kernel_file):
        source = kernel_file.location().read_text(encoding="utf-8")
        assert check_source(kernel_file, source) == []

    def test_the_shimmed_imports_are_the_ones_the_files_make(self):
        seen = {
            (fact.module, name)
            for f in KERNEL_FILES
            for fact in loader.module_imports(f.location().read_text(encoding="utf-8"))
            for name in fact.names
            if fact.module in loader.SHIM_NAMES
        }
        assert seen == {
            ("sglang.srt.utils", "is_cuda"),
            ("sglang.srt.utils", "is_hip"),
            ("sgl_kernel", "concat_mla_absorb_q"),
        }

    def test_an_altered_file_is_refused(self, tmp_path):
        shutil.copytree(wheels.kernel_dir(), tmp_path / "k")
        target = KERNEL_FILES[2].location(tmp_path / "k")
        target.write_text(target.read_text() + "\n# changed\n")
        reason = wheels.absent_reason(tmp_path / "k")
        assert reason is not None and "sha256 differs" in reason
        with pytest.raises(KernelsUnavailable, match="sha256 differs"):
            loader.load_kernels(tmp_path / "k")

    def test_without_triton_the_loader_says_so(self, monkeypatch):
        pytest.importorskip("torch")  # the loader asks for torch before triton
        real = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name)
        )
        with pytest.raises(KernelsUnavailable, match=r"need triton.*triton==3\.6\.0"):
            loader._load(wheels.kernel_dir().resolve())


class TestCheckSource:
    FILE = KERNEL_FILES[0]  # utils.py: create_flashinfer_kv_indices_triton

    GOOD = (
        "import torch\nimport triton\nimport triton.language as tl\n"
        "from sglang.srt.utils import is_cuda\n"
        "if is_cuda():\n    from sgl_kernel import concat_mla_absorb_q\n"
        "@triton.jit\ndef create_flashinfer_kv_indices_triton(a):\n    pass\n"
        "def helper():\n    import flashinfer.rope  # inside a function: not at load\n"
    )

    def test_a_conforming_source(self):
        assert check_source(self.FILE, self.GOOD) == []

    def test_a_missing_kernel(self):
        source = self.GOOD.replace("create_flashinfer_kv_indices_triton", "renamed")
        assert check_source(self.FILE, source) == [
            "0.5.10.post1/sglang/srt/layers/attention/utils.py: no @triton.jit "
            "create_flashinfer_kv_indices_triton"
        ]

    def test_a_new_import_from_sglang_or_the_shims(self):
        source = self.GOOD + "from sglang.srt.utils import get_bool_env_var\n"
        source += "from sglang.srt.server_args import get_global_server_args\n"
        source += "import numpy\n"
        problems = check_source(self.FILE, source)
        assert len(problems) == 3
        assert "get_bool_env_var from sglang.srt.utils, which the shim does not" in problems[0]
        assert "sglang.srt.server_args, which is not shimmed" in problems[1]
        assert "imports numpy (not expected)" in problems[2]

    def test_launchers_are_plain_functions(self):
        decode = KERNEL_FILES[1]
        source = "\n".join(
            [
                "import triton",
                *(f"@triton.jit\ndef {k}(x):\n    pass" for k in decode.kernels),
            ]
        )
        assert check_source(decode, source) == [
            f"{decode.wheel.version}/{decode.path}: no function decode_attention_fwd"
        ]


class TestShims:
    def test_a_real_sglang_in_the_process_is_refused(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "sglang", types.ModuleType("sglang"))
        with pytest.raises(KernelsUnavailable, match="real sglang package is already imported"):
            loader.install_shims()

    def test_the_sgl_kernel_stub_raises_when_called(self):
        with pytest.raises(RuntimeError, match="warpolicy stub"):
            loader._concat_mla_absorb_q()


class TestFetchScript:
    def fake_wheel(self, tmp_path, monkeypatch, code=b"x = 1\n"):
        """A wheel holding one pinned file; the script's pins point at it."""
        path = tmp_path / "wheels" / "sglang-9.9-py3-none-any.whl"
        path.parent.mkdir()
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("sglang/k.py", code)
            archive.writestr("sglang/other.py", b"not extracted\n")
            archive.writestr("sglang-9.9.dist-info/licenses/LICENSE", b"license\n")
        wheel = wheels.PinnedWheel(
            "9.9",
            path.name,
            hashlib.sha256(path.read_bytes()).hexdigest(),
            (
                wheels.PinnedFile("sglang/k.py", hashlib.sha256(b"x = 1\n").hexdigest()),
                wheels.PinnedFile("sglang-9.9.dist-info/licenses/LICENSE", "", "LICENSE"),
            ),
        )
        monkeypatch.setattr(wheels, "WHEELS", (wheel,))
        return wheel, path

    def test_extracts_only_the_pinned_files(self, tmp_path, monkeypatch):
        script = load_script()
        _, path = self.fake_wheel(tmp_path, monkeypatch)
        dest = tmp_path / "dest"
        assert script.main(["--wheels", str(path.parent), "--dest", str(dest)]) == 0
        got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
        assert got == ["9.9/LICENSE", "9.9/sglang/k.py"]

    def test_refuses_a_file_whose_sha256_differs(self, tmp_path, monkeypatch):
        script = load_script()
        wheel, path = self.fake_wheel(tmp_path, monkeypatch, code=b"x = 2\n")
        with pytest.raises(SystemExit, match="sglang/k.py: sha256 .* is not the pinned"):
            script.extract(wheel, path, tmp_path / "dest")
        assert not (tmp_path / "dest" / "9.9" / "sglang" / "k.py").exists()

    def test_a_wheel_whose_sha256_differs_is_downloaded_and_refused(self, tmp_path, monkeypatch):
        script = load_script()
        wheel, path = self.fake_wheel(tmp_path, monkeypatch)
        bad = attrs.evolve(wheel, sha256="0" * 64)

        def fake_download(w, into):  # pip "downloads" the same (wrong) bytes
            shutil.copy(path, into / w.filename)
            return into / w.filename

        monkeypatch.setattr(script, "download", fake_download)
        with pytest.raises(SystemExit, match="is not the pinned 0000"):
            script.find_wheel(bad, [path.parent], tmp_path)
