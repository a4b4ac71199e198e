"""Build hook: the default registry ships inside the package as ``warpolicy/capabilities.yaml``.

In the repository it sits at the top (the one reviewable file) and its editor modeline names
``warpolicy/capabilities.schema.json`` relative to that place. In the wheel the schema sits
beside it, so the packaged copy's modeline names ``capabilities.schema.json``: both resolve
(``tests/cli/test_schema_file.py`` checks the one it is run against, the repository or an
installed package).
"""

from __future__ import annotations

import pathlib
import re
import tempfile

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # imported by the tests for `packaged_registry`, without hatchling
    BuildHookInterface = object  # type: ignore[assignment,misc]

MODELINE = re.compile(r"# yaml-language-server: \$schema=\S+")
PACKAGED_MODELINE = "# yaml-language-server: $schema=capabilities.schema.json"


def packaged_registry(text: str) -> str:
    """The repository's ``capabilities.yaml`` as the package ships it."""
    first, sep, rest = text.partition("\n")
    if not MODELINE.fullmatch(first):
        raise ValueError(f"capabilities.yaml must start with a schema modeline, not {first!r}")
    return PACKAGED_MODELINE + sep + rest


class CustomBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or version == "editable":
            return  # an editable install reads the repository's file (loader.default_path)
        source = pathlib.Path(self.root) / "capabilities.yaml"
        staged = pathlib.Path(tempfile.mkdtemp(prefix="warpolicy-build-")) / "capabilities.yaml"
        staged.write_text(packaged_registry(source.read_text(encoding="utf-8")), encoding="utf-8")
        build_data["force_include"][str(staged)] = "warpolicy/capabilities.yaml"
