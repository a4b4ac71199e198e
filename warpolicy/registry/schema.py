"""The registry format: one table of keys, and the JSON Schema derived from it.

`warpolicy.registry.loader` validates YAML against the same tables (`SECTIONS`), so the schema an
editor sees and the keys the loader accepts cannot drift apart. Each key has a *kind* that
says what its value may be; the loader maps kinds to parsers, `registry_json_schema` maps
them to JSON Schema fragments.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from warpolicy.registry.vocabulary import (
    _MODE_ALIASES,
    _POLICY_ALIASES,
    RELEASE_ALIASES,
    FactType,
    ForwardMode,
    Placement,
    mode_names,
    policy_names,
    release_point_names,
)

#: The only registry format version this warpolicy reads.
FORMAT_VERSION = 1

#: Registry names (flags, spec algorithms, backends, gate ids, capabilities, families).
#: No ``=`` so ``--flag NAME=VALUE`` stays unambiguous, no spaces so tables line up.
#: ``$(?!\n)``: in Python's ``re`` (which JSON Schema validators written in Python use) ``$``
#: also matches before a trailing newline; the lookahead refuses that, and is a no-op in
#: ECMA-262 regexes, where ``$`` is already the end of the text.
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$(?!\n)"
#: Environment variable names a flag may be set by.
ENV_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$(?!\n)"
#: Human text (``doc``, ``because``): at least one non-space character.
TEXT_PATTERN = r"\S"

# Value kinds. Scalars:
VERSION = "version"  # the integer FORMAT_VERSION
BOOL = "bool"
TEXT = "text"  # a non-empty human sentence
NAME = "name"  # one registry name
POLICY = "policy"  # a release point name or alias (a gate's at_least: never nothing)
READ_END = "read_end"  # a read end: a policy, or nothing (reads no scheduler-shared state)
# Collections:
NAME_LIST = "name_list"  # a list of names (order kept)
NAME_SET = "name_set"  # a name or a list of names (any of)
ENV_LIST = "env_list"  # an env var name or a list of them (first wins)
POLICY_SET = "policy_set"  # a read end or a list of read ends (any of)
MODE_SET = "mode_set"  # a mode or a list of modes (any of)
MODE_POLICY_MAP = "mode_policy_map"  # mode -> policy
MODE_NAME_MAP = "mode_name_map"  # mode -> backend name
BOOL_MAP = "bool_map"  # name -> bool
PLANT = "plant"  # a placement for every mode, or mode -> placement
LAST_READER = "last_reader"  # draft_extend or target_verify
FACT_TYPE = "fact_type"  # int, bool, action or name
MODE_DECLARATION_MAP = "mode_declaration_map"  # mode -> read end | {policy, after, otherwise}
#                                                 | {CLASS: read end}
CAPABILITY_MAP = "capability_map"  # name -> bool | {after: ACTION}
LABEL_MAP = "label_map"  # label -> backend name
FACT_TESTS = "fact_tests"  # fact -> bool | int | {gt|ge|lt|le|eq: int} | name(s)
# Nested sections:
FLAG_MAP = "flag_map"
BUFFER_CLASS_MAP = "buffer_class_map"
FACT_MAP = "fact_map"
SPEC_MAP = "spec_map"
BACKEND_MAP = "backend_map"
GATE_LIST = "gate_list"
WHEN = "when"
ROUTES = "routes"


@attrs.frozen
class Key:
    """One key of a registry section."""

    name: str
    kind: str
    doc: str
    required: bool = False


_OVERRIDE_DOC = (
    "Replace an entry of the same name from an earlier file or fragment; without it "
    "a redefinition is an error."
)
_DOC_DOC = "One line saying why the entry is what it is (shown by explain and table)."

TOP_KEYS: tuple[Key, ...] = (
    Key(
        "version",
        VERSION,
        f"Registry format version; the integer {FORMAT_VERSION}, required in every file.",
        required=True,
    ),
    Key("flags", FLAG_MAP, "Operator switches, by name."),
    Key(
        "buffer_classes",
        BUFFER_CLASS_MAP,
        "Classes of scheduler-shared state a declaration may end reads of separately, by name, "
        "beyond the built-in metadata, recurrent_state, kv_pages and host_staging.",
    ),
    Key(
        "facts",
        FACT_MAP,
        "Per-batch facts, by name: values known only when a batch runs (a query-token count, "
        "whether a per-batch action succeeded, which child a router picked).",
    ),
    Key("spec_algorithms", SPEC_MAP, "Speculative decoding algorithms, by name."),
    Key("backends", BACKEND_MAP, "Attention backends and where their shared reads end, by name."),
    Key("gates", GATE_LIST, "Global gates: conditions that make a decision later, never earlier."),
)

FLAG_KEYS: tuple[Key, ...] = (
    Key("default", BOOL, "Value when no environment variable sets it (default false)."),
    Key(
        "env",
        ENV_LIST,
        "Environment variables that set the flag, the WARPOLICY_* name first, "
        "then aliases such as the anchor's SGLANG_* name; the first one set wins. An item "
        "{not: NAME} is an inverted alias: NAME=1 sets the flag false (an opt-out switch).",
    ),
    Key("doc", TEXT, _DOC_DOC, required=True),
    Key("override", BOOL, _OVERRIDE_DOC),
)

FACT_KEYS: tuple[Key, ...] = (
    Key(
        "type",
        FACT_TYPE,
        "int (tested against thresholds), bool, action (whether a per-batch action the runner "
        "performs succeeded: false, no report or an exception all mean it did not; tested "
        "only for false) or name (e.g. the child a router picked).",
        required=True,
    ),
    Key("values", NAME_LIST, "The names a name fact may take (gates and routers are checked)."),
    Key("doc", TEXT, _DOC_DOC, required=True),
    Key("override", BOOL, _OVERRIDE_DOC),
)

SPEC_KEYS: tuple[Key, ...] = (
    Key("family", NAME, "Family the algorithm belongs to (gates can match on it)."),
    Key(
        "capabilities",
        CAPABILITY_MAP,
        "Capability name -> bool, e.g. target_verify_read_done, "
        "prefill_read_done; an undeclared capability is false. {after: ACTION}: the "
        "algorithm has it only for a batch whose per-batch action succeeded.",
    ),
    Key(
        "last_reader",
        LAST_READER,
        "The last phase of a step that reads scheduler-shared "
        "state: draft_extend or target_verify. Left out: the last phase the step runs (the "
        "conservative default).",
    ),
    Key("doc", TEXT, _DOC_DOC),
    Key("override", BOOL, _OVERRIDE_DOC),
)

BACKEND_KEYS: tuple[Key, ...] = (
    Key(
        "reads_end",
        MODE_DECLARATION_MAP,
        "Forward mode -> where the backend's last read of "
        "scheduler-shared state ends; an undeclared mode is none (not audited, the coarse "
        "barrier); nothing: the mode reads no scheduler-shared state (declare it only where "
        "that is proven). "
        "{policy: P, after: ACTION, otherwise: Q}: P holds only for a batch whose per-batch "
        "action succeeded, else Q (default none). {CLASS: P, ...}: where the reads of each "
        "buffer class end (a single policy means {metadata: P}); the mode's release is the "
        "latest of its classes, and a class the mode does not name is none.",
    ),
    Key(
        "reads_classes",
        NAME_LIST,
        "Buffer classes this backend's kernels read (inherited): every declared mode must say "
        "where each ends ({CLASS: policy}); e.g. recurrent_state for linear-attention layers.",
    ),
    Key(
        "inherits",
        NAME,
        "Plain backend whose reads_end, plant and scoped gates this one "
        "starts from (not a composite or per-mode wrapper; not together with per_mode).",
    ),
    Key(
        "latest_of",
        NAME_LIST,
        "Composite: the read end is the latest of these children "
        "(two-batch overlap, hybrid linear+full, sparse+dense).",
    ),
    Key(
        "per_mode",
        MODE_NAME_MAP,
        "Per-mode wrapper: forward mode -> the child backend that runs that mode.",
    ),
    Key(
        "routes",
        ROUTES,
        "Per-batch router: the child that runs is chosen per batch and named by a name fact; "
        "the latest of every child it may route to unless the batch's fact names one (and the "
        "router is pinned). Not together with inherits, latest_of or per_mode.",
    ),
    Key(
        "plant",
        PLANT,
        "Where a runner plants the in-graph read-done node: marker (record "
        "right after the in-graph metadata prep, the default) or derived (after the captured "
        "graph's last shared readers); one value for every mode, or forward mode -> value. "
        "Inherited per mode like reads_end.",
    ),
    Key("gates", GATE_LIST, "Gates that apply only to this backend (and backends inheriting it)."),
    Key("abstract", BOOL, "A base to inherit from; left out of tables."),
    Key("doc", TEXT, _DOC_DOC),
    Key("override", BOOL, _OVERRIDE_DOC),
)

GATE_KEYS: tuple[Key, ...] = (
    Key(
        "id",
        NAME,
        "Stable identifier, unique across the registry (shown in reasons).",
        required=True,
    ),
    Key(
        "when",
        WHEN,
        "Conditions, all of which must hold; a list value means any of. "
        "Leave it out to apply always.",
    ),
    Key(
        "at_least",
        POLICY,
        "The decision is at least this late when the gate matches.",
        required=True,
    ),
    Key("because", TEXT, "Human reason shown when the gate moves a decision.", required=True),
    Key("doc", TEXT, "Longer note for reviewers."),
    Key("override", BOOL, "Replace a gate with the same id from an earlier file or fragment."),
)

WHEN_KEYS: tuple[Key, ...] = (
    Key("mode", MODE_SET, "Forward mode(s)."),
    Key("backend", NAME_SET, "Backend name(s) being decided (or one they inherit from)."),
    Key("spec", NAME_SET, "Speculative algorithm name(s)."),
    Key("spec_family", NAME_SET, "Speculative algorithm family (families)."),
    Key("spec_has", NAME_SET, "The algorithm has (any of) these capabilities."),
    Key("spec_lacks", NAME_SET, "The algorithm lacks (any of) these capabilities."),
    Key("flags", BOOL_MAP, "Flag name -> required value; all must hold."),
    Key("declared", POLICY_SET, "The backend's declared read end for the mode is (any of) these."),
    Key("platform", NAME_SET, "Platform name(s), e.g. cuda, hip, xpu, fake."),
    Key("eager", BOOL, "The forward runs eagerly (no captured graph)."),
    Key("planted", BOOL, "The read-done node was planted in the captured graph."),
    Key("external_events", BOOL, "The platform supports external (in-graph) events."),
    Key(
        "facts",
        FACT_TESTS,
        "Per-batch fact name -> test, all must hold: true/false (bool; an action only false), "
        "an integer or {gt, ge, lt, le, eq: N} (int), a name or a list of names (name). A fact "
        "the batch does not report passes every test (fail closed).",
    ),
)

ROUTE_KEYS: tuple[Key, ...] = (
    Key("fact", NAME, "The name fact whose per-batch value is the label of the child.", True),
    Key("children", LABEL_MAP, "Label -> the child backend it names.", required=True),
    Key("modes", MODE_SET, "Modes routed per batch (left out: every mode)."),
    Key("default", NAME, "The label of the child that runs every mode not routed."),
    Key(
        "pinned",
        BOOL,
        "The child chosen for a batch runs every layer of that forward (chosen once at "
        "metadata init and reused). Only a pinned router's fact narrows the decision; validate "
        "warns about a router without it.",
    ),
)

DECLARATION_KEYS: tuple[Key, ...] = (
    Key("policy", READ_END, "The read end once the action succeeded.", required=True),
    Key("after", NAME, "The action fact that must have succeeded for the batch.", required=True),
    Key("otherwise", READ_END, "The read end for any other batch (default none)."),
)

BUFFER_CLASS_KEYS: tuple[Key, ...] = (
    Key("doc", TEXT, "What state the class holds and who writes it.", required=True),
    Key("override", BOOL, _OVERRIDE_DOC),
)

CAPABILITY_AFTER_KEYS: tuple[Key, ...] = (
    Key("after", NAME, "The action fact that must have succeeded for the batch.", required=True),
)

#: Backend keys that must not appear together (a per-mode wrapper neither inherits nor is a
#: composite: either would hide declarations behind the delegated child).
EXCLUSIVE_BACKEND_KEYS: tuple[tuple[str, str], ...] = (
    ("latest_of", "per_mode"),
    ("per_mode", "inherits"),
    ("routes", "inherits"),
    ("routes", "latest_of"),
    ("routes", "per_mode"),
)

#: Every section the loader validates, by the name used in messages and schema ``$defs``.
SECTIONS: Mapping[str, tuple[Key, ...]] = {
    "registry": TOP_KEYS,
    "flag": FLAG_KEYS,
    "buffer_class": BUFFER_CLASS_KEYS,
    "fact": FACT_KEYS,
    "spec_algorithm": SPEC_KEYS,
    "backend": BACKEND_KEYS,
    "gate": GATE_KEYS,
    "when": WHEN_KEYS,
    "routes": ROUTE_KEYS,
    "declaration": DECLARATION_KEYS,
    "capability_after": CAPABILITY_AFTER_KEYS,
}

#: Names no buffer class may take: a mapping with them is a ``{policy, after, otherwise}``
#: declaration, never a class map.
CLASS_MAP_RESERVED: tuple[str, ...] = tuple(k.name for k in DECLARATION_KEYS)

#: The comparisons of an int fact test (``{gt: N}``), as the loader and the schema spell them.
COMPARISON_KEYS: tuple[str, ...] = ("gt", "ge", "lt", "le", "eq")


def keys_by_name(section: str) -> dict[str, Key]:
    """The keys of ``section`` as a dict (the loader's lookup table)."""
    return {k.name: k for k in SECTIONS[section]}


# -- JSON Schema -----------------------------------------------------------------------------

#: The project's canonical repository (pyproject.toml's [project.urls] say the same).
REPOSITORY = "https://github.com/warpolicy/warpolicy"
#: Where the schema lives: the file this package ships, on the repository's main branch.
SCHEMA_PATH = "warpolicy/capabilities.schema.json"
_SCHEMA_ID = (
    REPOSITORY.replace("https://github.com/", "https://raw.githubusercontent.com/")
    + f"/main/{SCHEMA_PATH}"
)


def _policy_enum() -> list[str]:
    names = release_point_names()
    return names + sorted(set(RELEASE_ALIASES) - set(names))


def _read_end_enum() -> list[str]:
    return list(policy_names()) + sorted(set(_POLICY_ALIASES) - set(policy_names()))


def _mode_enum() -> list[str]:
    return [m.value for m in ForwardMode] + [
        n for n in mode_names() if n not in {m.value for m in ForwardMode}
    ]


def _one_or_many(ref: dict, unique: bool = False) -> dict:
    many: dict = {"type": "array", "items": ref, "minItems": 1}
    if unique:
        many["uniqueItems"] = True
    return {"oneOf": [ref, many]}


def _spellings() -> dict[ForwardMode, list[str]]:
    """Each mode's accepted spellings: its name and its aliases."""
    out: dict[ForwardMode, list[str]] = {}
    for name, mode in _MODE_ALIASES.items():
        out.setdefault(mode, []).append(name)
    return out


def _has_mode(mode: ForwardMode) -> dict:
    return {"anyOf": [{"required": [name]} for name in _spellings()[mode]]}


def _delegated_or_declared() -> list[dict]:
    """A mode in ``per_mode`` is not also in ``reads_end`` (under any spelling)."""
    return [
        {
            "if": {"required": ["per_mode"], "properties": {"per_mode": _has_mode(mode)}},
            "then": {"properties": {"reads_end": {"not": _has_mode(mode)}}},
        }
        for mode in ForwardMode
    ]


def _otherwise_later() -> list[dict]:
    """A declaration's ``otherwise`` (default none) is later than its ``policy``, under any
    spelling of either."""
    spellings: dict[int, list[str]] = {}
    for name, policy in _POLICY_ALIASES.items():
        spellings.setdefault(int(policy), []).append(name)
    rules = []
    for level in sorted(spellings):
        not_later = [n for lvl in sorted(spellings) if lvl <= level for n in spellings[lvl]]
        rules.append(
            {
                "if": {"properties": {"policy": {"enum": spellings[level]}}},
                "then": {
                    "required": ["otherwise"],
                    "properties": {"otherwise": {"not": {"enum": not_later}}},
                }
                if level == max(spellings)
                else {"properties": {"otherwise": {"not": {"enum": not_later}}}},
            }
        )
    return rules


def _mode_map(values: dict) -> dict:
    """mode -> value; a mode may be written once, under its name or one alias."""
    spellings = _spellings()
    once = [
        {"not": {"required": [a, b]}}
        for names in spellings.values()
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    ]
    return {
        "type": "object",
        "propertyNames": {"$ref": "#/$defs/mode"},
        "additionalProperties": values,
        "allOf": once,
    }


def _kind_schema(kind: str) -> dict:
    """JSON Schema fragment for a value kind (nested sections are ``$ref``s)."""
    name = {"$ref": "#/$defs/name"}
    placement = {"enum": [p.value for p in Placement]}
    comparisons = {
        "type": "object",
        "propertyNames": {"enum": list(COMPARISON_KEYS)},
        "additionalProperties": {"type": "integer"},
        "minProperties": 1,
    }
    env_name = {"type": "string", "pattern": ENV_PATTERN}
    inverted = {
        "type": "object",
        "properties": {"not": env_name},
        "required": ["not"],
        "additionalProperties": False,
    }
    table: dict[str, dict] = {
        VERSION: {"type": "integer", "const": FORMAT_VERSION},
        BOOL: {"type": "boolean"},
        TEXT: {"type": "string", "pattern": TEXT_PATTERN},
        NAME: name,
        POLICY: {"$ref": "#/$defs/policy"},
        READ_END: {"$ref": "#/$defs/read_end"},
        NAME_LIST: {"type": "array", "items": name, "minItems": 1, "uniqueItems": True},
        NAME_SET: _one_or_many(name),
        ENV_LIST: _one_or_many({"oneOf": [env_name, inverted]}, unique=True),
        POLICY_SET: _one_or_many({"$ref": "#/$defs/read_end"}),
        MODE_SET: _one_or_many({"$ref": "#/$defs/mode"}),
        MODE_POLICY_MAP: _mode_map({"$ref": "#/$defs/policy"}),
        MODE_NAME_MAP: _mode_map(name),
        PLANT: {"oneOf": [placement, _mode_map(placement)]},
        LAST_READER: {"enum": [ForwardMode.DRAFT_EXTEND.value, ForwardMode.TARGET_VERIFY.value]},
        FACT_TYPE: {"enum": [t.value for t in FactType]},
        MODE_DECLARATION_MAP: _mode_map(
            {
                "oneOf": [
                    {"$ref": "#/$defs/read_end"},
                    {"$ref": "#/$defs/declaration"},
                    {"$ref": "#/$defs/class_map"},
                ]
            }
        ),
        CAPABILITY_MAP: {
            "type": "object",
            "propertyNames": name,
            "additionalProperties": {
                "oneOf": [{"type": "boolean"}, {"$ref": "#/$defs/capability_after"}]
            },
        },
        LABEL_MAP: {
            "type": "object",
            "propertyNames": name,
            "additionalProperties": name,
            "minProperties": 1,
        },
        FACT_TESTS: {
            "type": "object",
            "propertyNames": name,
            "additionalProperties": {
                "oneOf": [
                    {"type": "boolean"},
                    {"type": "integer"},
                    comparisons,
                    name,
                    {"type": "array", "items": name, "minItems": 1},
                ]
            },
        },
        BOOL_MAP: {
            "type": "object",
            "propertyNames": name,
            "additionalProperties": {"type": "boolean"},
        },
        FLAG_MAP: _named_map("flag"),
        BUFFER_CLASS_MAP: _named_map("buffer_class"),
        FACT_MAP: _named_map("fact"),
        SPEC_MAP: _named_map("spec_algorithm"),
        BACKEND_MAP: _named_map("backend"),
        GATE_LIST: {"type": ["array", "null"], "items": {"$ref": "#/$defs/gate"}},
        WHEN: {"$ref": "#/$defs/when"},
        ROUTES: {"$ref": "#/$defs/routes"},
    }
    return table[kind]


def _named_map(section: str) -> dict:
    return {
        "type": ["object", "null"],
        "propertyNames": {"$ref": "#/$defs/name"},
        "additionalProperties": {"$ref": f"#/$defs/{section}"},
    }


def _section_schema(section: str, description: str) -> dict:
    keys = SECTIONS[section]
    props = {}
    for key in keys:
        prop = dict(_kind_schema(key.kind))
        prop["description"] = key.doc
        props[key.name] = prop
    out = {
        "type": "object",
        "description": description,
        "properties": props,
        "additionalProperties": False,
    }
    required = [k.name for k in keys if k.required]
    if required:
        out["required"] = required
    return out


_SECTION_DOCS = {
    "flag": "An operator switch: a default plus the environment variables that set it.",
    "buffer_class": "A class of scheduler-shared state (declarations name it in {CLASS: "
    "policy} maps).",
    "fact": "A per-batch fact: a value the runner knows only when a batch runs, with its type.",
    "spec_algorithm": "A speculative algorithm and the capabilities gates test.",
    "backend": "An attention backend: plain (reads_end, inherits), composite (latest_of), "
    "per-mode (per_mode) or per-batch router (routes); per_mode and routes exclude latest_of "
    "and inherits, and each other.",
    "gate": "A condition that can only make a decision later (at_least), with a human reason.",
    "when": "Gate conditions; every key given must hold.",
    "routes": "A per-batch router: the fact naming the child, the children by label, the modes "
    "routed per batch and the child every other mode runs.",
    "declaration": "A read end that holds only after a per-batch action succeeded.",
    "capability_after": "A capability the algorithm has only after a per-batch action succeeded.",
}


def registry_json_schema() -> dict:
    """A JSON Schema (draft 2020-12) of the registry format, for editors and CI linters."""
    defs: dict = {
        "name": {
            "type": "string",
            "pattern": NAME_PATTERN,
            "description": "A registry name (letters, digits, _ . + -).",
        },
        "policy": {
            "enum": _policy_enum(),
            "description": "Where the read-done event is published, earliest first: "
            "pre_replay < in_graph < post_replay < none "
            "(aliases: coarse, unknown = none; in_replay = in_graph).",
        },
        "read_end": {
            "enum": _read_end_enum(),
            "description": "Where a forward's last read of scheduler-shared state ends, "
            "earliest first: nothing < pre_replay < in_graph < post_replay < none. nothing: "
            "it reads no scheduler-shared state (an explicit declaration; undeclared is none, "
            "the coarse barrier).",
        },
        "mode": {
            "enum": _mode_enum(),
            "description": "Forward mode (aliases: prefill = extend, verify = "
            "target_verify, draft_extend_v2 = draft_extend).",
        },
    }
    for section, doc in _SECTION_DOCS.items():
        defs[section] = _section_schema(section, doc)
    defs["class_map"] = {
        "type": "object",
        "description": "Buffer class -> where its reads end; the mode's release is the latest.",
        "propertyNames": {
            "allOf": [{"$ref": "#/$defs/name"}, {"not": {"enum": list(CLASS_MAP_RESERVED)}}]
        },
        "additionalProperties": {"$ref": "#/$defs/read_end"},
        "minProperties": 1,
    }
    defs["backend"]["not"] = {
        "anyOf": [
            {"required": list(pair)}  # one shape per backend
            for pair in EXCLUSIVE_BACKEND_KEYS
        ]
    }
    defs["backend"]["allOf"] = _delegated_or_declared()
    defs["declaration"]["allOf"] = _otherwise_later()
    defs["fact"]["if"] = {"properties": {"type": {"not": {"const": FactType.NAME.value}}}}
    defs["fact"]["then"] = {"not": {"required": ["values"]}}
    defs["routes"]["dependentRequired"] = {"default": ["modes"]}
    top = _section_schema("registry", "A warpolicy capability registry (capabilities.yaml).")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": _SCHEMA_ID,
        "title": "warpolicy capability registry",
        **top,
        "$defs": defs,
    }
