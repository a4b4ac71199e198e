"""Fuzz the loader: any input yields a Registry or a RegistryError with located problems."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warpolicy.errors import RegistryError
from warpolicy.registry.loader import Fragment, default_registry_path, load_registry
from warpolicy.registry.model import Registry
from warpolicy.registry.schema import SECTIONS

DEFAULT_TEXT = default_registry_path().read_text()
DEFAULT_LINES = DEFAULT_TEXT.splitlines(keepends=True)
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

#: Words that steer random documents into the registry's own vocabulary.
KEYS = sorted({k.name for keys in SECTIONS.values() for k in keys})
WORDS = KEYS + [
    "fa3",
    "base",
    "none",
    "eagle",
    "decode",
    "extend",
    "prefill",
    "in_graph",
    "pre_replay",
    "post_replay",
    "force_coarse",
    "g1",
    "WARPOLICY_X",
    "1",
    "true",
]


def outcome(sources, marked: bool = True):
    """Load ``sources``; the only allowed failure is a RegistryError with located problems."""
    try:
        return load_registry(sources)
    except RegistryError as exc:
        assert exc.problems
        names = {s.name if isinstance(s, Fragment) else str(s) for s in sources}
        for problem in exc.problems:
            assert problem.file in names
            assert problem.message and "\n" not in problem.message
            if marked:
                assert problem.line >= 1 and problem.col >= 1, problem
            else:
                assert (problem.line, problem.col) == (0, 0), problem
        return exc


@FUZZ
@given(st.text(max_size=300))
def test_random_text(text):
    outcome([Fragment("fuzz.yaml", text)])


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "r.yaml"
    path.write_bytes(data)
    outcome([path])


@st.composite
def mutated_default(draw) -> str:
    """The default registry with a few line- or character-level edits."""
    lines = list(DEFAULT_LINES)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(
            st.sampled_from(
                ["delete", "duplicate", "swap", "indent", "dedent", "chars", "word", "truncate"]
            )
        )
        if op == "delete" and len(lines) > 1:
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "indent":
            lines[i] = "  " + lines[i]
        elif op == "dedent":
            lines[i] = lines[i][2:]
        elif op == "chars":
            k = draw(st.integers(0, len(lines[i])))
            junk = draw(st.text(alphabet=":-[]{},#&*!|>'\"%@` \t\n\x00aZ9é", max_size=5))
            lines[i] = lines[i][:k] + junk + lines[i][k + draw(st.integers(0, 3)) :]
        elif op == "word":
            lines[i] = lines[i].replace(
                draw(st.sampled_from(WORDS)), draw(st.sampled_from(WORDS)), 1
            )
        elif op == "truncate":
            lines = lines[: i + 1]
    return "".join(lines)


@FUZZ
@given(mutated_default())
def test_mutated_default_registry(composer, text):
    result = outcome([Fragment("capabilities.yaml", text)])
    if isinstance(result, Registry):
        assert result.sources == ("capabilities.yaml",)


def scalars():
    return st.one_of(
        st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(WORDS), st.text(max_size=8)
    )


def documents():
    """Random nested data biased toward registry keys."""
    keys = st.one_of(st.sampled_from(WORDS), st.text(max_size=6))
    return st.recursive(
        scalars(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)
        ),
        max_leaves=25,
    )


@st.composite
def registry_like(draw) -> dict:
    doc = {"version": draw(st.sampled_from([1, 1, 1, 2, "1", None]))}
    for section in ["flags", "spec_algorithms", "backends"]:
        if draw(st.booleans()):
            doc[section] = draw(st.dictionaries(st.sampled_from(WORDS), documents(), max_size=4))
    if draw(st.booleans()):
        doc["gates"] = draw(st.lists(documents(), max_size=3))
    return doc


@FUZZ
@given(registry_like())
def test_random_documents_as_yaml(doc):
    outcome([Fragment("doc.yaml", yaml.safe_dump(doc, sort_keys=False))])


@FUZZ
@given(registry_like())
def test_random_documents_as_plugin_mappings(doc):
    base = Fragment("base.yaml", "version: 1\n")
    result = outcome([base, Fragment("plugin:fuzz", doc)], marked=False)
    if isinstance(result, RegistryError):
        assert all(p.file == "plugin:fuzz" for p in result.problems)


@FUZZ
@given(mutated_default(), mutated_default())
def test_layered_mutations(first, second):
    outcome([Fragment("a.yaml", first), Fragment("b.yaml", second)])


def _expanded_size(node) -> int:
    """How many scalars a document holds once every alias is expanded (PyYAML's view)."""
    if isinstance(node, dict):
        return sum(_expanded_size(v) for v in node.values()) + len(node)
    if isinstance(node, list):
        return sum(_expanded_size(v) for v in node)
    return 1


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 30), st.integers(1, 18))
def test_alias_fanout_stays_polynomial(width, depth, nesting):
    """Anchors and aliases share nodes: a flat list aliased into ``depth`` gates, and a list
    nested ``nesting`` times through aliases (2**nesting scalars once expanded). The problems
    reported stay within the size of the *text* (per alias use at most), never the size of the
    expansion."""
    text = "version: 1\nx: &a [" + ", ".join(["1"] * width) + "]\n"
    text += "l0: &l0 [decod, decod]\n"
    text += "".join(f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]\n" for i in range(1, nesting))
    text += "gates:\n" + "".join(
        f"  - {{id: g{i}, at_least: none, because: x, when: {{mode: *a}}}}\n" for i in range(depth)
    )
    text += f"  - {{id: deep, at_least: none, because: x, when: {{mode: *l{nesting - 1}}}}}\n"
    result = outcome([Fragment("alias.yaml", text)])
    assert isinstance(result, RegistryError)
    bound = (width + 2) * (depth + 2) + 2 * nesting + 8  # text-sized, alias uses included
    assert len(result.problems) <= bound, len(result.problems)
    if nesting >= 12:  # the check can fail: expanding every alias would exceed the bound
        assert _expanded_size(yaml.safe_load(text)) > bound
