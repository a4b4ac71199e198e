"""`warpolicy.registry.compare`: every field that can make a release earlier is compared (a
mutation per field, and the list of fields checked against the model), the proportional
comparison agrees with a brute-force one on random registries, and its cost follows what
changed."""

from __future__ import annotations

import copy
import itertools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from warpolicy.registry import compare, model
from warpolicy.registry import engine as engine_module
from warpolicy.registry.cells import (
    BACKEND_CONDITIONS,
    FACT_NAMES,
    MAX_BATCH_SETTINGS,
    PER_BATCH_CONDITIONS,
    STATIC_CONDITIONS,
    cell_space,
)
from warpolicy.registry.compare import (
    CELLS,
    DEFAULTS,
    ENV,
    FIELD_COVERAGE,
    PER_BATCH,
    PLACEMENT,
    STEP_CELLS,
    diff_engines,
    earlier_layers,
)
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.facts import ABSENT as NOT_REPORTED
from warpolicy.registry.loader import Fragment, load_registry, registry_sources
from warpolicy.registry.report import format_diff
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy

# -- the fields ------------------------------------------------------------------------------


def model_fields() -> set[str]:
    classes = [
        obj
        for obj in vars(model).values()
        if isinstance(obj, type) and attrs.has(obj) and obj.__module__ == model.__name__
    ]
    return {f"{c.__name__}.{f.name}" for c in classes for f in attrs.fields(c)}


def test_every_field_of_the_model_says_how_a_comparison_sees_it():
    """A new field of the registry model fails here until `FIELD_COVERAGE` lists it (and, if it
    can move a release, `MUTATIONS` below shows the diff catching it)."""
    fields = model_fields()
    assert fields - set(FIELD_COVERAGE) == set(), "add these to compare.FIELD_COVERAGE"
    assert set(FIELD_COVERAGE) - fields == set(), "stale entries in compare.FIELD_COVERAGE"


def test_every_gate_condition_is_static_per_backend_a_flag_or_an_axis():
    """A condition on a new runner fact needs a `compare.FactAxis`, else diff never varies it
    (per-batch facts are enumerated by class, `PER_BATCH_CONDITIONS`)."""
    known = set(STATIC_CONDITIONS) | set(BACKEND_CONDITIONS) | {"flags"} | set(FACT_NAMES)
    known |= set(PER_BATCH_CONDITIONS)
    assert {f.name for f in attrs.fields(model.Conditions)} - known == set()


# -- a mutation per field that can make a release earlier -------------------------------------

BASE: dict = {
    "version": 1,
    "flags": {"opt_in": {"default": False, "env": ["T_OPT_IN"], "doc": "x"}},
    "facts": {
        "act": {"type": "action", "doc": "x"},
        "act2": {"type": "action", "doc": "x"},
        "route": {"type": "name", "doc": "x"},
        "route2": {"type": "name", "doc": "x"},
        "n": {"type": "int", "doc": "x"},
        "bf": {"type": "bool", "doc": "x"},
        "named": {"type": "name", "values": ["x", "y"], "doc": "x"},
    },
    "spec_algorithms": {
        "fam_spec": {
            "family": "fam",
            "capabilities": {"cap": True},
            "last_reader": "draft_extend",
            "doc": "x",
        },
        "slow_spec": {
            "family": "slow",
            "capabilities": {"cap": False, "other_cap": False},
            "doc": "x",
        },
        "fam_twin": {"family": "fam", "doc": "x"},
    },
    "backends": {
        "base": {"abstract": True, "reads_end": {"decode": "in_graph"}, "doc": "x"},
        "fast_base": {"abstract": True, "reads_end": {"decode": "pre_replay"}, "doc": "x"},
        "late": {"reads_end": {"decode": "post_replay", "extend": "post_replay"}, "doc": "x"},
        "early": {"reads_end": {"decode": "pre_replay", "extend": "pre_replay"}, "doc": "x"},
        "b": {
            "inherits": "base",
            # draft_extend reads nothing: with last_reader draft_extend the step releases at
            # its pre_replay event, with target_verify at verify's in_graph one (earlier)
            "reads_end": {
                "extend": "pre_replay",
                "target_verify": "in_graph",
                "draft_extend": "nothing",
            },
            "doc": "x",
        },
        "comp": {"latest_of": ["early", "late"], "doc": "x"},
        "wrap": {"per_mode": {"decode": "late"}, "reads_end": {"extend": "pre_replay"}, "doc": "x"},
    },
    "gates": [
        {
            "id": "opt-in",
            "when": {"mode": "extend", "flags": {"opt_in": False}},
            "at_least": "none",
            "because": "x",
        },
        {
            "id": "needs-cap",
            "when": {"mode": "target_verify", "spec_lacks": "cap"},
            "at_least": "none",
            "because": "x",
        },
    ],
}


def gate(gid: str, at_least: str = "post_replay", **when: object) -> dict:
    return {"id": gid, "when": when, "at_least": at_least, "because": "x"}


def with_gate(g: dict) -> Callable[[dict], None]:
    def add(r: dict) -> None:
        r["gates"].append(g)

    return add


def set_in(*path: object, value: object) -> Callable[[dict], None]:
    def put(r: dict) -> None:
        node = r
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return put


def _after(otherwise: str = "none") -> dict:
    """``early``'s decode declared only after the action ``act`` (a batch that reports nothing:
    ``otherwise``)."""
    return {"policy": "pre_replay", "after": "act", "otherwise": otherwise}


def _router(modes: object = None, default: object = None, pinned: bool = False) -> dict:
    """A router over ``late`` (x) and ``early`` (y): a batch that reports no route runs either."""
    routes: dict = {"fact": "route", "children": {"x": "late", "y": "early"}}
    if pinned:
        routes["pinned"] = True
    if modes is not None:
        routes["modes"] = modes
    if default is not None:
        routes["default"] = default
    return {"routes": routes, "doc": "x"}


#: field -> (what the old registry adds to BASE, what the new one changes on top of that)
MUTATIONS: dict[str, tuple[Callable[[dict], object], Callable[[dict], object]]] = {
    "Flag.default": (lambda r: None, set_in("flags", "opt_in", "default", value=True)),
    "Flag.env": (lambda r: None, set_in("flags", "opt_in", "env", value=["T_OTHER", "T_OPT_IN"])),
    "SpecAlgorithm.family": (
        with_gate(gate("fam-late", mode="decode", spec_family="fam")),
        set_in("spec_algorithms", "fam_spec", "family", value="other"),
    ),
    "SpecAlgorithm.capabilities": (
        lambda r: None,
        set_in("spec_algorithms", "slow_spec", "capabilities", value={"cap": True}),
    ),
    "SpecAlgorithm.last_reader": (
        lambda r: None,
        set_in("spec_algorithms", "fam_spec", "last_reader", value="target_verify"),
    ),
    "Conditions.mode": (lambda r: None, set_in("gates", 0, "when", "mode", value="decode")),
    "Conditions.backend": (
        with_gate(gate("only-b", mode="decode", backend="b")),
        set_in("gates", 2, "when", "backend", value="late"),
    ),
    "Conditions.spec": (
        with_gate(gate("spec-gate", mode="decode", spec="fam_spec")),
        set_in("gates", 2, "when", "spec", value="slow_spec"),
    ),
    "Conditions.spec_family": (
        with_gate(gate("family-gate", mode="decode", spec_family="fam")),
        set_in("gates", 2, "when", "spec_family", value="slow"),
    ),
    "Conditions.spec_has": (
        with_gate(gate("has-gate", mode="decode", spec_has="cap")),
        set_in("gates", 2, "when", "spec_has", value="other_cap"),
    ),
    "Conditions.spec_lacks": (
        with_gate(gate("lacks-gate", mode="decode", spec_lacks="other_cap")),
        set_in("gates", 2, "when", "spec_lacks", value="cap"),
    ),
    "Conditions.flags": (
        lambda r: None,
        set_in("gates", 0, "when", "flags", value={"opt_in": True}),
    ),
    "Conditions.declared": (
        with_gate(gate("declared-gate", mode="decode", declared="in_graph")),
        set_in("gates", 2, "when", "declared", value="pre_replay"),
    ),
    "Conditions.platform": (
        with_gate(gate("platform-gate", mode="decode", platform="cuda")),
        set_in("gates", 2, "when", "platform", value="hip"),
    ),
    "Conditions.eager": (
        with_gate(gate("eager-gate", mode="decode", eager=False)),
        set_in("gates", 2, "when", "eager", value=True),
    ),
    "Conditions.planted": (
        with_gate(gate("planted-gate", mode="decode", planted=True)),
        set_in("gates", 2, "when", "planted", value=False),
    ),
    "Conditions.external_events": (
        with_gate(gate("events-gate", mode="decode", external_events=True)),
        set_in("gates", 2, "when", "external_events", value=False),
    ),
    "Gate.when": (lambda r: None, set_in("gates", 0, "when", value={"mode": "decode"})),
    "Gate.at_least": (lambda r: None, set_in("gates", 0, "at_least", value="post_replay")),
    "Gate.scope": (
        set_in("backends", "b", "gates", value=[gate("scoped", mode="decode")]),
        lambda r: r["backends"]["late"].__setitem__("gates", r["backends"]["b"].pop("gates")),
    ),
    "Registry.gates": (lambda r: None, lambda r: r["gates"].pop(0)),
    "Backend.reads_end": (
        lambda r: None,
        set_in("backends", "late", "reads_end", "decode", value="in_graph"),
    ),
    "Backend.inherits": (lambda r: None, set_in("backends", "b", "inherits", value="fast_base")),
    "Backend.latest_of": (lambda r: None, set_in("backends", "comp", "latest_of", value=["early"])),
    "Backend.per_mode": (
        lambda r: None,
        set_in("backends", "wrap", "per_mode", "decode", value="early"),
    ),
    "Backend.gates": (
        set_in("backends", "b", "gates", value=[gate("scoped", mode="decode")]),
        lambda r: r["backends"]["b"].pop("gates"),
    ),
    "Backend.plant": (
        lambda r: None,
        set_in("backends", "b", "plant", value={"decode": "derived"}),
    ),
    # per-batch shapes, as a batch that reports no facts sees them (the later policy)
    "Flag.inverted": (
        lambda r: None,
        set_in("flags", "opt_in", "env", value=[{"not": "T_OPT_IN"}]),
    ),
    "Backend.reads_end_after": (
        set_in("backends", "early", "reads_end", "decode", value=_after()),
        set_in("backends", "early", "reads_end", "decode", value="pre_replay"),
    ),
    "After.otherwise": (
        set_in("backends", "early", "reads_end", "decode", value=_after()),
        set_in("backends", "early", "reads_end", "decode", value=_after("post_replay")),
    ),
    "Backend.routes": (
        set_in("backends", "router", value=_router()),
        set_in("backends", "router", value={"latest_of": ["early"], "doc": "x"}),
    ),
    "Route.children": (
        set_in("backends", "router", value=_router()),
        set_in("backends", "router", "routes", "children", value={"x": "early", "y": "early"}),
    ),
    "Route.modes": (
        set_in("backends", "router", value=_router(modes=["decode"], default="y")),
        set_in("backends", "router", "routes", "modes", value=["extend"]),
    ),
    "Route.default": (
        set_in("backends", "router", value=_router(modes=["extend"], default="x")),
        set_in("backends", "router", "routes", "default", value="y"),
    ),
    "SpecAlgorithm.capabilities_after": (
        lambda r: (
            with_gate(gate("has-cap3", mode="decode", spec_has="cap3"))(r),
            set_in("spec_algorithms", "slow_spec", "capabilities", "cap3", value={"after": "act"})(
                r
            ),
        ),
        set_in("spec_algorithms", "slow_spec", "capabilities", "cap3", value=False),
    ),
    # per-batch fields: a change that only batches reporting facts see (the diff enumerates
    # every class of batch); each new registry releases some class of batch earlier
    "Conditions.facts": (
        with_gate(gate("decode-none", "none", mode="decode")),
        set_in("gates", 2, "when", "facts", value={"act": False}),
    ),
    "FactTest.equals": (
        with_gate(gate("bf-none", "none", mode="decode", facts={"bf": True})),
        set_in("gates", 2, "when", "facts", "bf", value=False),
    ),
    "FactTest.compare": (
        with_gate(gate("n-none", "none", mode="decode", facts={"n": {"gt": 5}})),
        set_in("gates", 2, "when", "facts", "n", value={"gt": 10}),
    ),
    "FactTest.names": (
        with_gate(gate("route-none", "none", mode="decode", facts={"route": ["x"]})),
        set_in("gates", 2, "when", "facts", "route", value=["y"]),
    ),
    "Fact.values": (  # a batch naming z: unknown before (the gate held), another name now
        with_gate(gate("named-none", "none", mode="decode", facts={"named": ["y"]})),
        set_in("facts", "named", "values", value=["x", "y", "z"]),
    ),
    "After.action": (
        set_in("backends", "early", "reads_end", "decode", value=_after()),
        set_in("backends", "early", "reads_end", "decode", "after", value="act2"),
    ),
    "Route.fact": (
        set_in("backends", "router", value=_router(pinned=True)),
        set_in("backends", "router", "routes", "fact", value="route2"),
    ),
    "Route.pinned": (
        set_in("backends", "router", value=_router()),
        set_in("backends", "router", "routes", "pinned", value=True),
    ),
    # the cell (the latest class) stays post_replay; only the metadata class moves earlier
    "Backend.reads_end_classes": (
        set_in(
            "backends",
            "lin",
            value={
                "reads_end": {
                    "decode": {"metadata": "post_replay", "recurrent_state": "post_replay"}
                }
            },
        ),
        set_in("backends", "lin", "reads_end", "decode", "metadata", value="in_graph"),
    ),
}

MOVES_RELEASES = {CELLS, DEFAULTS, ENV, STEP_CELLS, PLACEMENT, PER_BATCH}


def test_every_field_that_can_move_a_release_has_a_mutation():
    needed = {name for name, how in FIELD_COVERAGE.items() if how in MOVES_RELEASES}
    assert needed == set(MUTATIONS)


def registries(field: str) -> tuple[str, str]:
    before, change = MUTATIONS[field]
    old = copy.deepcopy(BASE)
    before(old)
    new = copy.deepcopy(old)
    change(new)
    return yaml.safe_dump(old, sort_keys=False), yaml.safe_dump(new, sort_keys=False)


def engines(old: str, new: str) -> tuple[PolicyEngine, PolicyEngine]:
    return (
        PolicyEngine(load_registry([Fragment("old", old)]), environ={}),
        PolicyEngine(load_registry([Fragment("new", new)]), environ={}),
    )


@pytest.mark.parametrize("field", sorted(MUTATIONS))
def test_a_change_to_each_field_that_releases_earlier_needs_an_audit(field):
    old, new = engines(*registries(field))
    space = cell_space([old.registry, new.registry])
    found = diff_engines(old, new, space)
    assert found.needs_audit, (field, [(c.backend, c.mode, c.change) for c in found.cells])
    back = diff_engines(new, old, cell_space([new.registry, old.registry]))
    assert back.cells or back.flags  # the reverse change is seen too


def test_a_flipped_default_is_compared_at_each_sides_default():
    old, new = engines(*registries("Flag.default"))
    found = diff_engines(old, new, cell_space([old.registry, new.registry]))
    cell = next(c for c in found.cells if (c.backend, c.mode, c.spec) == ("b", "extend", "none"))
    assert (cell.old, cell.new, cell.change, cell.when) == (
        "none",
        "pre_replay",
        "earlier",
        "opt_in=default",
    )


def test_last_reader_gives_step_cells_ordered_by_phase_then_policy():
    old, new = engines(*registries("SpecAlgorithm.last_reader"))
    found = diff_engines(old, new, cell_space([old.registry, new.registry]))
    steps = {(c.backend, c.old, c.new, c.change) for c in found.cells if c.mode == "step"}
    # the step released at the draft extend (it reads nothing: pre_replay); now at verify
    assert ("b", "pre_replay at draft_extend", "in_graph at target_verify", "earlier") in steps
    # early and late declare neither phase: none (coarse) on both sides, no step cell
    assert {s[0] for s in steps} == {"b"}


def test_a_later_phase_that_publishes_stays_the_release():
    """SpecStep releases after a later phase that decides to publish, whatever last_reader
    says: naming verify while draft extend publishes moves no release."""
    old_text, new_text = registries("SpecAlgorithm.last_reader")
    nothing = "draft_extend: nothing"
    old, new = engines(
        old_text.replace(nothing, "draft_extend: post_replay", 1),
        new_text.replace(nothing, "draft_extend: post_replay", 1),
    )
    found = diff_engines(old, new, cell_space([old.registry, new.registry]))
    assert [c for c in found.cells if c.mode == "step"] == []


def test_a_later_phase_that_decides_none_stays_the_release():
    """Issue 26 finding 3: ``none`` is unknown, so naming verify while the draft extend is
    undeclared moves no release: the step stays coarse (0.3.0 reported nothing either, but
    its runtime released at verify)."""
    old_text, new_text = registries("SpecAlgorithm.last_reader")
    old, new = engines(
        old_text.replace("draft_extend: nothing", "decode: in_graph", 1),
        new_text.replace("draft_extend: nothing", "decode: in_graph", 1),
    )
    found = diff_engines(old, new, cell_space([old.registry, new.registry]))
    assert [c for c in found.cells if c.mode == "step"] == []


@pytest.mark.parametrize(
    "old, new, change",
    [
        ((ForwardMode.DRAFT_EXTEND, "pre_replay"), (ForwardMode.DRAFT_EXTEND, "none"), "later"),
        ((ForwardMode.DRAFT_EXTEND, "none"), (ForwardMode.TARGET_VERIFY, "in_graph"), "earlier"),
        ((ForwardMode.TARGET_VERIFY, "none"), (ForwardMode.DRAFT_EXTEND, "none"), "later"),
        (
            (ForwardMode.TARGET_VERIFY, "post_replay"),
            (ForwardMode.DRAFT_EXTEND, "pre_replay"),
            "later",
        ),
        (
            (ForwardMode.DRAFT_EXTEND, "pre_replay"),
            (ForwardMode.TARGET_VERIFY, "none"),
            "later",
        ),
        ((ForwardMode.DRAFT_EXTEND, "nothing"), (ForwardMode.DRAFT_EXTEND, "in_graph"), "later"),
        (
            (ForwardMode.DRAFT_EXTEND, "nothing"),
            (ForwardMode.TARGET_VERIFY, "post_replay"),
            "earlier",
        ),
    ],
)
def test_step_order(old, new, change):
    def rank(phase, policy):
        return compare._step_value(phase, WarReadDonePolicy.parse(policy))[1]

    assert compare._step_change(rank(*old), rank(*new)) == change


def test_a_derived_node_is_a_moved_cell():
    old, new = engines(*registries("Backend.plant"))
    found = diff_engines(old, new, cell_space([old.registry, new.registry]))
    (cell,) = [c for c in found.cells if (c.backend, c.mode, c.spec) == ("b", "decode", "none")]
    assert (cell.old, cell.new, cell.change) == ("in_graph", "in_graph (derived)", "moved")


def test_env_names_of_a_tested_flag_are_a_flag_change():
    old, new = engines(*registries("Flag.env"))
    found = diff_engines(old, new, cell_space([old.registry, new.registry]))
    assert [(f.name, f.new_env, f.change) for f in found.flags] == [
        ("opt_in", ("T_OTHER", "T_OPT_IN"), "earlier")
    ]
    assert found.cells == ()  # without the environment every cell is the same


def test_the_layer_report_sees_a_flipped_default(tmp_path):
    """Issue 22 item 1: validate's layer report (and the plugins list) compare each prefix under
    its own defaults."""
    flip = tmp_path / "flip.yaml"
    flip.write_text(
        "version: 1\nflags:\n  prefill_read_done:\n    override: true\n    default: true\n"
        "    env: [WARPOLICY_PREFILL_READ_DONE, SGLANG_ENABLE_PREFILL_WAR_READ_DONE]\n"
        "    doc: flipped\n"
    )
    (change,) = earlier_layers(registry_sources(["default", str(flip)]))
    cells = {(c.backend, c.mode, c.spec): c for c in change.cells}
    cell = cells[("trtllm_mha", "extend", "none")]
    assert (cell.old, cell.new) == ("none", "pre_replay")
    assert "prefill_read_done=default" in cell.when


# -- the proportional comparison against a brute-force one -------------------------------------

POLICIES = [p.label for p in WarReadDonePolicy]
MODES = ["decode", "extend", "target_verify", "draft_extend"]


@st.composite
def registry_pairs(draw) -> tuple[dict, dict]:
    """Two small registries that share most entries."""
    flags = {
        f"f{i}": {"default": draw(st.booleans()), "env": [f"T_F{i}"], "doc": "x"} for i in range(2)
    }
    specs = {
        "s": {
            "family": draw(st.sampled_from(["a", "b"])),
            "capabilities": {"cap": draw(st.booleans())},
            "last_reader": draw(st.sampled_from(["draft_extend", "target_verify"])),
            "doc": "x",
        }
    }
    names = ["p0", "p1", "p2"]
    backends: dict = {}
    for i, name in enumerate(names):
        entry: dict = {
            "reads_end": draw(
                st.dictionaries(st.sampled_from(MODES), st.sampled_from(POLICIES), max_size=3)
            ),
            "doc": "x",
        }
        if i and draw(st.booleans()):
            entry["inherits"] = names[0]
        if draw(st.booleans()):
            entry["plant"] = "derived"
        backends[name] = entry
    backends["c"] = {"latest_of": ["p1", "p2"], "doc": "x"}
    backends["w"] = {"per_mode": {"decode": draw(st.sampled_from(names))}, "doc": "x"}
    for name in names:  # a gate scoped to a backend reaches what inherits or runs it
        if draw(st.booleans()):
            backends[name]["gates"] = [
                {
                    "id": f"scoped-{name}",
                    "when": {
                        "mode": draw(st.sampled_from(MODES)),
                        "flags": {f"f{draw(st.integers(0, 1))}": draw(st.booleans())},
                    },
                    "at_least": draw(st.sampled_from(POLICIES[1:])),
                    "because": "x",
                }
            ]

    def gates() -> list:
        out = []
        for i in range(draw(st.integers(0, 3))):
            when: dict = {}
            if draw(st.booleans()):
                when["mode"] = draw(st.sampled_from(MODES))
            if draw(st.booleans()):
                when["flags"] = {f"f{draw(st.integers(0, 1))}": draw(st.booleans())}
            if draw(st.booleans()):
                when["spec_lacks"] = "cap"
            if draw(st.booleans()):
                when["planted"] = draw(st.booleans())
            if draw(st.booleans()):
                when["platform"] = "hip"
            if not when:
                when["mode"] = "extend"
            out.append(gate(f"g{i}", draw(st.sampled_from(POLICIES[1:])), **when))
        return out

    old: dict[str, Any] = {
        "version": 1,
        "flags": flags,
        "spec_algorithms": specs,
        "backends": backends,
        "gates": gates(),
    }
    new = copy.deepcopy(old)
    # one or more edits: a flag default, a declaration, the gates, last_reader, a new backend
    # half the time a declaration alone: only what runs that backend is evaluated then
    kinds = ["flag", "declare", "gates", "reader", "extra"]
    edits = draw(st.one_of(st.just({"declare"}), st.sets(st.sampled_from(kinds), min_size=1)))
    if "flag" in edits:
        new["flags"]["f0"]["default"] = not new["flags"]["f0"]["default"]
    if "declare" in edits:
        victim = draw(st.sampled_from(names))
        new["backends"][victim]["reads_end"][draw(st.sampled_from(MODES))] = draw(
            st.sampled_from(POLICIES)
        )
    if "gates" in edits:
        new["gates"] = gates()
    if "reader" in edits:
        new["spec_algorithms"]["s"]["last_reader"] = draw(
            st.sampled_from(["draft_extend", "target_verify"])
        )
    if "extra" in edits:
        new["backends"]["extra"] = {"reads_end": {"decode": "pre_replay"}, "doc": "x"}
    return old, new


def brute_force(old: PolicyEngine, new: PolicyEngine) -> dict[tuple[str, str, str], set[str]]:
    """Every (backend, mode, spec) that differs under *some* setting of every axis (flags both
    ways and at each side's default, platform, planted), with how."""
    found: dict[tuple[str, str, str], set[str]] = {}
    flags = sorted(old.registry.flags)
    values = [(False, True, "default")] * len(flags)
    # eager and external events reach a decision only through sound demotion here (no drawn
    # gate tests them), a monotone map on both sides: the fast path shows what they would
    facts = list(itertools.product(["cuda", "hip", "other"], [True], [False], [True, False]))
    backends = sorted(set(old.registry.backends) & set(new.registry.backends))
    sides = (compare._Side(old), compare._Side(new))
    for combo in itertools.product(*values):
        given: dict[str, Any] = {f: v for f, v in zip(flags, combo) if v != "default"}
        for platform, events, eager, planted in facts:
            kw: dict[str, Any] = dict(
                platform=platform, external_events=events, eager=eager, planted=planted
            )
            a = old.table(backends, ["none", "s"], MODES, given, **kw)
            b = new.table(backends, ["none", "s"], MODES, given, **kw)
            for x, y in zip(a, b):
                name, mode = x.context.backend, x.context.mode
                pa = sides[0].label(name, mode, x.policy)
                pb = sides[1].label(name, mode, y.policy)
                change = compare._mode_change(pa, pb)
                if change is not None:
                    found.setdefault((name, mode.label, x.context.spec), set()).add(change)
    return found


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(registry_pairs())
def test_proportional_comparison_finds_what_brute_force_finds(pair):
    texts = [yaml.safe_dump(r, sort_keys=False) for r in pair]
    try:
        old, new = engines(*texts)
    except Exception:  # noqa: BLE001 - a drawn registry the loader refuses: nothing to compare
        return
    space = cell_space([old.registry, new.registry], modes=MODES)
    found = diff_engines(old, new, space)
    common = set(old.registry.backends) & set(new.registry.backends)
    mode_cells: dict[tuple[str, str, str], set[str]] = {}
    for c in found.cells:
        if c.mode != "step" and c.backend in common:
            mode_cells.setdefault((c.backend, c.mode, c.spec), set()).add(c.change)
    assert mode_cells == brute_force(old, new)
    earlier = diff_engines(old, new, space, earlier_only=True)
    assert {(c.backend, c.mode, c.spec) for c in earlier.cells if c.mode != "step"} == {
        k for k, v in mode_cells.items() if v & {"earlier", "moved"}
    }


def test_a_changed_child_is_seen_in_every_backend_that_runs_it():
    old, new = engines(*registries("Backend.reads_end"))  # late: decode post_replay -> in_graph
    found = diff_engines(old, new, cell_space([old.registry, new.registry], modes=["decode"]))
    assert {(c.backend, c.change) for c in found.cells if c.spec == "none"} == {
        ("late", "earlier"),
        ("comp", "earlier"),  # latest_of [early, late]
        ("wrap", "earlier"),  # per_mode {decode: late}
    }


# -- cost and size follow what changed ---------------------------------------------------------


def layer(n: int) -> str:
    lines = ["version: 1", "backends:"]
    for i in range(n):
        lines += [
            f"  be_{i:04d}:",
            "    inherits: base",
            "    reads_end: {extend: pre_replay}",
            f"    doc: Backend number {i}, layered over the default registry's base.",
        ]
    return "\n".join(lines) + "\n"


def test_a_layer_of_new_backends_evaluates_nothing_in_common(tmp_path):
    """Issue 22 item 4: 200 `inherits: base` backends over the default took 27-33 s to validate
    and 2 GiB to diff; only what changed is evaluated now, and the listing is bounded."""
    path = tmp_path / "layer.yaml"
    path.write_text(layer(200))
    old = PolicyEngine.load(["default"], environ={})
    new = PolicyEngine.load(["default", str(path)], environ={})
    space = cell_space([old.registry, new.registry])
    found = diff_engines(old, new, space, expand=100)
    assert found.evaluated_backends == 0
    assert len(found.added_backends) == 200
    assert found.counts()["added"] == 200 * len(space.modes) * len(space.specs())
    doc = json.loads(format_diff(found, space, "json", limit=100))
    assert len(doc["cells"]) == 100 and doc["summary"]["cells"]["added"] == 200 * 9 * len(
        space.specs()
    )
    assert earlier_layers(registry_sources(["default", str(path)])) == []


def test_an_override_of_base_evaluates_what_inherits_from_it(tmp_path):
    path = tmp_path / "layer.yaml"
    path.write_text(
        layer(50) + "  base:\n    override: true\n    abstract: true\n"
        "    reads_end: {decode: pre_replay, target_verify: in_graph}\n    doc: faster\n"
    )
    old = PolicyEngine.load(["default"], environ={})
    new = PolicyEngine.load(["default", str(path)], environ={})
    found = diff_engines(old, new, cell_space([old.registry, new.registry]), earlier_only=True)
    common = set(old.registry.backends)
    assert 0 < found.evaluated_backends < len(common)  # what reaches base, not everything
    assert not any(c.backend.startswith("be_") for c in found.cells)  # added: never earlier
    cells = {(c.backend, c.mode, c.spec): c for c in found.cells}
    assert cells[("fa3", "decode", "none")].new == "pre_replay"


def test_a_column_is_skipped_only_when_every_setting_makes_it_none():
    """BASE's opt-in gate makes extend none only while the flag is off: the column is still
    compared (the flag on shows the change); the capability gate makes verify none for
    slow_spec whatever the setting: that column is not evaluated."""
    old_text, _ = registries("Backend.reads_end")
    new_text = old_text.replace("extend: post_replay", "extend: pre_replay", 1)
    assert new_text != old_text
    old, new = engines(old_text, new_text)
    space = cell_space([old.registry, new.registry])
    found = diff_engines(old, new, space)
    cells = {(c.backend, c.mode, c.spec): c for c in found.cells}
    assert cells[("late", "extend", "none")].when == "opt_in=true"
    assert space.column(ForwardMode.TARGET_VERIFY, "slow_spec").all_none
    assert not space.column(ForwardMode.EXTEND, "none").all_none


@pytest.mark.parametrize(
    "old_gate, new_gate, when",
    [
        # a raised threshold: batches of 6..10 query tokens now release early
        ({"n": {"gt": 5}}, {"n": {"gt": 10}}, "6 <= n <= 10"),
        # an action the batch may now report instead of a fact it could not
        ({"n": {"gt": 5}}, {"n": {"gt": 5}, "act": False}, "act succeeded"),
    ],
)
def test_a_change_only_batches_reporting_facts_see_is_caught(old_gate, new_gate, when):
    """Issue 22's rule for per-batch facts: the diff compares every class of batch, and the
    earlier cell names the batches in its ``when``."""

    def registry(when_facts: dict) -> str:
        doc = copy.deepcopy(BASE)
        doc["facts"]["n"] = {"type": "int", "doc": "x"}
        doc["gates"].append(gate("big", "none", mode="decode", facts=when_facts))
        return yaml.safe_dump(doc, sort_keys=False)

    old, new = engines(registry(old_gate), registry(new_gate))
    space = cell_space([old.registry, new.registry])
    found = diff_engines(old, new, space)
    assert found.needs_audit
    cell = next(
        c for c in found.cells if (c.backend, c.mode, c.spec) == ("early", "decode", "none")
    )
    assert (cell.old, cell.new, cell.change) == ("none", "pre_replay", "earlier")
    assert when in cell.when, cell.when
    assert "n" in space.batch_facts
    back = diff_engines(new, old, cell_space([new.registry, old.registry]))
    assert not back.needs_audit  # the reverse change is only later


def test_too_many_classes_of_batch_fail_closed():
    """A column with more combinations of per-batch classes than `MAX_BATCH_SETTINGS` is not
    compared, and the diff needs an audit (never a pass), even when nothing else changed."""
    actions = {f"a{i}": False for i in range(9)}  # 2**9 = 512 combinations

    def registry(policy: str) -> str:
        doc = copy.deepcopy(BASE)
        for name in actions:
            doc["facts"][name] = {"type": "action", "doc": "x"}
        doc["gates"].append(gate("many", "none", mode="decode", facts=actions))
        doc["backends"]["late"]["reads_end"]["decode"] = policy
        return yaml.safe_dump(doc, sort_keys=False)

    # late's decode made in_graph: a change the gate would hide for some batches or not
    old, new = engines(registry("post_replay"), registry("in_graph"))
    space = cell_space([old.registry, new.registry])
    found = diff_engines(old, new, space)
    assert found.needs_audit and found.cells == ()  # nothing listed, yet it fails
    specs = sorted({"none", *BASE["spec_algorithms"]})
    assert [u.split(":", 1)[0] for u in found.uncompared] == [f"decode spec {s}" for s in specs]
    assert f"exceed {MAX_BATCH_SETTINGS}" in found.uncompared[0]
    text = format_diff(found, space)
    assert "cannot compare decode spec" in text
    doc = json.loads(format_diff(found, space, "json"))
    assert doc["schema_version"] == 3 and doc["summary"]["needs_audit"]
    assert doc["summary"]["uncompared"] == list(found.uncompared)
    (layer,) = earlier_layers(
        [
            Fragment("old", registry("post_replay")),
            Fragment(
                "new",
                "version: 1\nbackends:\n  late:\n    override: true\n"
                "    reads_end: {decode: in_graph}\n    doc: x\n",
            ),
        ]
    )
    assert "cannot be compared" in layer.note
    # holding the facts (diff --fact) brings the column under the bound
    held = cell_space([old.registry, new.registry], fixed={"a0": True, "a1": True})
    assert diff_engines(old, new, held).uncompared == ()


def test_per_batch_cells_show_the_batches_in_when_and_json():
    old, new = engines(*registries("FactTest.compare"))
    space = cell_space([old.registry, new.registry], modes=["decode"])
    found = diff_engines(old, new, space)
    (cell,) = [c for c in found.cells if (c.backend, c.spec) == ("early", "none")]
    assert (cell.old, cell.new, cell.when) == ("none", "pre_replay", "6 <= n <= 10")
    doc = json.loads(format_diff(found, space, "json"))
    row = next(r for r in doc["cells"] if (r["backend"], r["spec"]) == ("early", "none"))
    assert row["batches"] == [{"n": "6 <= n <= 10"}]
    assert all("n" not in setting for setting in row["settings"])
    assert "n" in doc["compared"]["batch_facts"]
    assert "per batch: each setting for every class of n" in format_diff(found, space)


def test_a_column_a_staged_capability_may_open_is_compared():
    """A global ``spec_lacks`` gate on a capability the algorithm has after an action makes the
    column none only for batches whose action did not succeed: the column is not skipped, and a
    change that staged batches see is caught (the default registry's EAGLE extend column)."""

    def registry(policy: str) -> str:
        doc = copy.deepcopy(BASE)
        doc["spec_algorithms"]["slow_spec"]["capabilities"]["cap3"] = {"after": "act"}
        doc["gates"].append(gate("lacks-cap3", "none", mode="decode", spec_lacks="cap3"))
        doc["backends"]["early"]["reads_end"]["decode"] = policy
        return yaml.safe_dump(doc, sort_keys=False)

    old, new = engines(registry("in_graph"), registry("pre_replay"))
    space = cell_space([old.registry, new.registry], modes=["decode"])
    assert not space.column(ForwardMode.DECODE, "slow_spec").all_none
    found = diff_engines(old, new, space)
    cells = {(c.backend, c.spec): c for c in found.cells}
    cell = cells[("early", "slow_spec")]
    assert (cell.old, cell.new, cell.change, cell.when) == (
        "in_graph",
        "pre_replay",
        "earlier",
        "act succeeded",
    )


# -- per-batch classes against brute force over fact values ------------------------------------

# None: not reported; -1 and 21-22 lie past every threshold the strategy draws (0-20)
N_VALUES = [None, -1, *range(23)]
ROUTES = [None, "x", "y", "z", "w"]  # "w": a name no drawn registry tests or routes by


@st.composite
def fact_registry_pairs(draw) -> tuple[dict, dict]:
    """Two small registries whose gates, declarations and router read per-batch facts."""

    def backends() -> dict:
        out: dict = {}
        for name in ("p0", "p1"):
            reads = {}
            for mode in ("decode", "extend"):
                policy = draw(st.sampled_from(POLICIES))
                if policy != "none" and draw(st.booleans()):
                    policy = {"policy": policy, "after": "act", "otherwise": "none"}
                reads[mode] = policy
            out[name] = {"reads_end": reads, "doc": "x"}
        out["rt"] = {
            "routes": {
                "fact": "r",
                "children": {"x": "p0", "y": "p1"},
                "pinned": draw(st.booleans()),
            },
            "doc": "x",
        }
        return out

    def gates() -> list:
        out = []
        for i in range(draw(st.integers(0, 3))):
            facts: dict = {}
            if draw(st.booleans()):
                op = draw(st.sampled_from(["gt", "ge", "lt", "le", "eq"]))
                facts["n"] = {op: draw(st.integers(0, 20))}
            if draw(st.booleans()):
                facts["act"] = False
            if draw(st.booleans()):
                facts["r"] = draw(st.sampled_from([["x"], ["y"], ["x", "z"]]))
            when: dict = {"mode": draw(st.sampled_from(["decode", "extend"]))}
            if facts:
                when["facts"] = facts
            out.append(gate(f"g{i}", draw(st.sampled_from(POLICIES[1:])), **when))
        return out

    def registry() -> dict:
        return {
            "version": 1,
            "facts": {
                "n": {"type": "int", "doc": "x"},
                "act": {"type": "action", "doc": "x"},
                "r": {"type": "name", "doc": "x"},
            },
            "backends": backends(),
            "gates": gates(),
        }

    old = registry()
    new = copy.deepcopy(old)
    edit = draw(st.sampled_from(["gates", "backends", "both"]))
    if edit in ("gates", "both"):
        new["gates"] = gates()
    if edit in ("backends", "both"):
        new["backends"] = backends()
    return old, new


def batches() -> list[dict[str, object]]:
    """Many batches: every value of ``N_VALUES`` x action x ``ROUTES`` (None: not reported)."""
    out = []
    for n, act, route in itertools.product(N_VALUES, (True, False), ROUTES):
        batch: dict[str, object] = {"act": act, "n": n, "r": route}
        out.append({k: v for k, v in batch.items() if v is not None})
    return out


def brute_force_batches(old: PolicyEngine, new: PolicyEngine) -> dict[tuple, list]:
    """Per (backend, mode, change): every batch among `batches` whose decision differs so."""
    found: dict[tuple, list] = {}
    backends = sorted(old.registry.backends)
    for batch in batches():
        rows = [
            e.table(backends, ["none"], ["decode", "extend"], batch_facts=batch, cases=False)
            for e in (old, new)
        ]
        for x, y in zip(*rows):
            change = compare._mode_change(x.policy.label, y.policy.label)
            if change is not None:
                key = (x.context.backend, x.context.mode.label, change)
                found.setdefault(key, []).append(batch)
    return found


def same_class(engines_: Sequence[PolicyEngine], name: str, value: object, probe: object) -> bool:
    """Whether ``value`` and ``probe`` fall in the same class of fact ``name`` on every side."""
    for engine in engines_:
        classes = engine.facts()[name]
        if classes.classify(value) != classes.classify(probe):
            return False
    return True


def _below_zero_pair() -> tuple[dict, dict]:
    """CI's counterexample: a gate on ``n >= 0`` dropped, so ``n <= -1`` now releases later."""
    reads = {"decode": "none", "extend": "pre_replay"}
    doc: dict[str, Any] = {
        "version": 1,
        "facts": {
            "n": {"type": "int", "doc": "x"},
            "act": {"type": "action", "doc": "x"},
            "r": {"type": "name", "doc": "x"},
        },
        "backends": {
            "p0": {"reads_end": reads, "doc": "x"},
            "p1": {"reads_end": {"decode": "pre_replay", "extend": "none"}, "doc": "x"},
            "rt": {
                "routes": {"fact": "r", "children": {"x": "p0", "y": "p1"}, "pinned": False},
                "doc": "x",
            },
        },
        "gates": [
            {
                "id": "g0",
                "when": {"mode": "decode", "facts": {"n": {"ge": 0}}},
                "at_least": "in_graph",
                "because": "x",
            }
        ],
    }
    new = copy.deepcopy(doc)
    del new["gates"][0]["when"]["facts"]
    return doc, new


def _untested_route_pair() -> tuple[dict, dict]:
    """A later counterexample: the new side gates decode to in_graph but back to none for the
    routes ``x`` and ``z``, so a route no side names is earlier than before (none -> in_graph)."""
    old, _ = _below_zero_pair()
    old["gates"] = []
    old["backends"]["p0"]["reads_end"] = {"decode": "none", "extend": "pre_replay"}
    old["backends"]["p1"]["reads_end"] = {"decode": "pre_replay", "extend": "pre_replay"}
    old["backends"]["rt"]["routes"]["pinned"] = True
    new = copy.deepcopy(old)
    new["backends"]["p0"]["reads_end"]["decode"] = "pre_replay"
    new["backends"]["rt"]["routes"]["pinned"] = False
    new["gates"] = [
        {"id": "g0", "when": {"mode": "decode"}, "at_least": "in_graph", "because": "x"},
        {
            "id": "g1",
            "when": {"mode": "decode", "facts": {"r": ["x", "z"]}},
            "at_least": "none",
            "because": "x",
        },
    ]
    return old, new


@settings(
    max_examples=int(os.environ.get("WARPOLICY_TEST_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(fact_registry_pairs())
@example(_below_zero_pair())
@example(_untested_route_pair())
def test_per_batch_classes_find_what_brute_force_over_fact_values_finds(pair):
    """The diff's classes (the union of both sides' thresholds, names, true/false, not
    reported) and its reading of the engine's cases agree with evaluating many batches."""
    texts = [yaml.safe_dump(r, sort_keys=False) for r in pair]
    try:
        old, new = engines(*texts)
    except Exception:  # noqa: BLE001 - a drawn registry the loader refuses
        return
    space = cell_space([old.registry, new.registry], modes=["decode", "extend"])
    found = diff_engines(old, new, space)
    cells: dict[tuple, list] = {}  # (backend, mode, change) -> the classes of batch reported
    for c in found.cells:
        if c.spec == "none":
            cells.setdefault((c.backend, c.mode, c.change), []).extend(s.batch for s in c.settings)
    brute = brute_force_batches(old, new)
    assert set(cells) == set(brute)
    # every batch that differs falls in a class of batch the diff reports for that cell
    sides = (old, new)
    for key, differing in brute.items():
        reported = cells[key]
        for batch in differing:
            assert any(
                all(
                    same_class(sides, name, batch.get(name, NOT_REPORTED), chosen.value)
                    for name, chosen in combo
                )
                for combo in reported
            ), (key, batch)


@settings(max_examples=int(os.environ.get("WARPOLICY_TEST_EXAMPLES", "25")))
@given(fact_registry_pairs())
@example(_below_zero_pair())
@example(_untested_route_pair())
def test_the_runtime_layer_warning_finds_what_brute_force_over_fact_values_finds(pair):
    """`PolicyEngine.compile`'s layer warning (`engine._earlier_cell`) names a cell exactly when
    some batch among `batches`, in some runner cell (captured or eager, planted or not), gets an
    earlier policy from ``new`` than from ``old``, by `PolicyEngine.decide` (the evaluation,
    not the compiled rules the warning reads). The drawn registries declare and gate decode
    and extend only; every other mode is none on both sides."""
    texts = [yaml.safe_dump(r, sort_keys=False) for r in pair]
    try:
        old, new = engines(*texts)
    except Exception:  # noqa: BLE001 - a drawn registry the loader refuses
        return
    for backend in sorted(old.registry.backends):
        compiled = [e._compiled(backend, "none", None, "cuda", True) for e in (old, new)]
        warned = engine_module._earlier_cell(*compiled, "none")
        earlier = [
            (mode.label, eager, planted, batch)
            for mode in (ForwardMode.DECODE, ForwardMode.EXTEND)
            for eager in (False, True)
            for planted in (False, True)
            for batch in batches()
            if new.decide(Context(backend, mode, eager=eager, planted=planted, facts=batch))
            < old.decide(Context(backend, mode, eager=eager, planted=planted, facts=batch))
        ]
        assert (warned is not None) == bool(earlier), (backend, warned, earlier[:3])


def test_a_fact_type_change_that_validates_moves_no_release():
    """`FACT_TYPE`: bool <-> action, tested only for false, decides every batch alike (an
    unreported bool is unknown, so its test holds; an unreported action did not succeed)."""

    def registry(kind: str) -> str:
        doc = copy.deepcopy(BASE)
        doc["facts"]["bf"]["type"] = kind
        doc["gates"].append(gate("bf-none", "none", mode="decode", facts={"bf": False}))
        return yaml.safe_dump(doc, sort_keys=False)

    old, new = engines(registry("bool"), registry("action"))
    space = cell_space([old.registry, new.registry], modes=["decode"])
    assert "bf" in space.batch_facts
    assert diff_engines(old, new, space).cells == ()
    assert diff_engines(new, old, cell_space([new.registry, old.registry])).cells == ()


def test_a_gate_scoped_to_a_child_is_enumerated_for_the_parent_that_changed():
    """Only the changed backend is evaluated, but the flags and facts of gates scoped to the
    backends it runs are still enumerated (`cells.reach`): ``solo`` now decides what ``early``
    does, and ``early``'s own gate keeps it none only while ``opt_in`` is off."""

    def registry(solo: dict) -> str:
        doc = copy.deepcopy(BASE)
        scoped = gate("early-off", "none", mode="decode", flags={"opt_in": False})
        doc["backends"]["early"]["gates"] = [scoped]
        doc["backends"]["solo"] = {**solo, "doc": "x"}
        return yaml.safe_dump(doc, sort_keys=False)

    old, new = engines(
        registry({"latest_of": ["early"], "reads_end": {"decode": "none"}}),
        registry({"latest_of": ["early"]}),
    )
    space = cell_space([old.registry, new.registry], modes=["decode"])
    found = diff_engines(old, new, space)
    assert found.evaluated_backends == 1
    cells = {(c.backend, c.spec): c for c in found.cells}
    cell = cells[("solo", "none")]
    assert (cell.old, cell.new, cell.change, cell.when) == (
        "none",
        "pre_replay",
        "earlier",
        "opt_in=true",
    )


# -- issue 26: step cells on every change, per class of batch; flags past the bound ------------

STEP_REGISTRY = """\
version: 1
flags:
  f: {default: false, env: [T_F], doc: x}
facts:
  draft_extend_staged: {type: action, doc: x}
spec_algorithms:
  tv: {last_reader: target_verify, doc: verify is the declared last reader}
  de: {last_reader: draft_extend, doc: the draft extend is the declared last reader}
backends:
  b:
    reads_end: {target_verify: in_graph, draft_extend: %s}
    doc: x
gates: %s
"""


def step_cells(old_text: str, new_text: str, spec: str) -> set[tuple[str, str, str, str]]:
    old, new = engines(old_text, new_text)
    found = diff_engines(old, new, cell_space([old.registry, new.registry]))
    return {
        (c.old, c.new, c.change, c.when)
        for c in found.cells
        if (c.mode, c.spec)
        == (
            "step",
            spec,
        )
    }


def test_a_draft_extend_that_stops_reading_nothing_is_a_later_step():
    """Finding 3, the diff's side: the step cell follows the runtime on every change, not only
    when last_reader changes (0.3.0 listed no step cell here: last_reader did not change)."""
    cells = step_cells(STEP_REGISTRY % ("nothing", "[]"), STEP_REGISTRY % ("none", "[]"), "tv")
    assert cells == {("in_graph at target_verify", "none", "later", "any")}
    back = step_cells(STEP_REGISTRY % ("none", "[]"), STEP_REGISTRY % ("nothing", "[]"), "tv")
    assert back == {("none", "in_graph at target_verify", "earlier", "any")}


def test_a_gate_that_makes_the_draft_extend_read_moves_the_step_later():
    gate_text = (
        "[{id: g, when: {mode: draft_extend, flags: {f: true}}, at_least: post_replay, because: x}]"
    )
    cells = step_cells(
        STEP_REGISTRY % ("nothing", "[]"), STEP_REGISTRY % ("nothing", gate_text), "tv"
    )
    assert cells == {
        ("in_graph at target_verify", "post_replay at draft_extend", "later", "f=true")
    }


def test_a_later_only_gate_that_reads_the_staging_action_is_an_earlier_step():
    """Finding 4: a gate on target verify that tests draft_extend_staged (later for verify)
    makes verify's runner report the action, so a staged batch's step releases at verify, not
    after the draft extend: earlier for that class of batch (0.3.0: exit 0)."""
    gate_text = (
        "[{id: g, when: {mode: target_verify, facts: {draft_extend_staged: false}}, "
        "at_least: post_replay, because: x}]"
    )
    old_text = STEP_REGISTRY % ("in_graph", "[]")
    new_text = STEP_REGISTRY % ("in_graph", gate_text)
    cells = step_cells(old_text, new_text, "de")
    assert (
        "in_graph at draft_extend",
        "in_graph at target_verify",
        "earlier",
        "draft_extend_staged succeeded",
    ) in cells
    old, new = engines(old_text, new_text)
    assert diff_engines(old, new, cell_space([old.registry, new.registry])).needs_audit


class _TableModel:
    """A phase's model: the in-graph prep reads the shared ``table``."""

    def __init__(self, table: Any) -> None:
        import torch

        self.torch = torch
        self.table = table
        self.shared_buffers = {"table": table}
        self.seen: dict[int, Any] = {}

    def bucket_sizes(self, mode: ForwardMode) -> tuple[int, ...]:
        return (1, 2)

    def prepare_bucket(self, bucket: int) -> None:
        self.seen.setdefault(bucket, self.torch.zeros(bucket))

    def host_prep(self, batch: Any, bucket: int) -> None:
        pass

    def graph_prep(self, bucket: int) -> None:
        self.seen[bucket].copy_(self.table[:bucket])

    def forward(self, bucket: int) -> Any:
        return self.seen[bucket] * 2


@pytest.mark.parametrize("extend", POLICIES)
@pytest.mark.parametrize("spec", ["tv", "de"])
def test_step_cells_agree_with_the_runtime_spec_step(extend, spec):
    """The oracle is the runtime: a `SpecStep` of verify then draft extend on the simulated
    platform, each phase's runner asking the compiled policy, releases where the diff's step
    value says (for every read end of the draft extend and both last readers)."""
    import warnings

    import torch

    from warpolicy.runtime.runners import DraftExtendRunner, SpecStep, VerifyRunner
    from warpolicy.testing import sim_platform

    engine = PolicyEngine(load_registry([Fragment("r", STEP_REGISTRY % (extend, "[]"))]), {})
    policy = engine.compile("b", spec, strict=True)
    platform = sim_platform()
    table = torch.arange(4, dtype=torch.float32)
    verify = VerifyRunner(
        _TableModel(table), policy, platform, name="target_verify", draft_tokens=1
    )
    draft = DraftExtendRunner(_TableModel(table), policy, platform, name="draft_extend")
    step = SpecStep([verify, draft], last_reader=engine.spec(spec).last_reader)
    step.capture()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        step.run([1.0])
    read_done = step.fence.take()
    runtime = "none" if read_done is None else f"{read_done.policy.label} at {read_done.source}"
    side = compare._Side(engine)
    space = cell_space([engine.registry], modes=list(compare._PHASES))
    (setting,) = space.column(compare._PHASES, spec).settings  # the fast path only
    reader = compare._step_reader(engine.spec(spec))
    label, _rank = compare._step_values(side, ["b"], spec, reader, setting)["b"]
    # the diff holds runner facts at the fast path (planted); the draft extend's runner never
    # plants a marker, so its in_graph is demoted to post_replay (the same monotone map)
    assert label.replace("in_graph at draft_extend", "post_replay at draft_extend") == runtime


def test_flags_past_the_bound_fail_closed_like_batches():
    """Finding 5: nine flags tested in one column (512 settings > 256); 0.3.0 held the last one
    at its default, so an earlier change under it exited 0 with a ``held:`` line."""

    def text(last: str) -> str:
        flags = "".join(f"  f{i}: {{default: false, env: [T_F{i}], doc: x}}\n" for i in range(9))
        gates = "".join(
            f"  - {{id: g{i}, when: {{mode: decode, flags: {{f{i}: true}}}}, "
            f"at_least: {last if i == 8 else 'post_replay'}, because: x}}\n"
            for i in range(9)
        )
        return (
            "version: 1\nflags:\n" + flags + "backends:\n  b: {reads_end: {decode: in_graph}, "
            "doc: x}\ngates:\n" + gates
        )

    old, new = engines(text("none"), text("post_replay"))  # earlier under f8=true
    space = cell_space([old.registry, new.registry], modes=["decode"])
    found = diff_engines(old, new, space)
    assert found.needs_audit and found.uncompared
    assert "exceed 256" in found.uncompared[0] and "--flag" in found.uncompared[0]
    assert ("f8", next(why for n, why in space.held if n == "f8")) in space.held
    assert "fails closed" in dict(space.held)["f8"]
    # given flags bring the column under the bound, and the change shows
    fixed = cell_space(
        [old.registry, new.registry], modes=["decode"], fixed={"f0": False, "f1": False}
    )
    found = diff_engines(old, new, fixed)
    assert found.uncompared == () and {c.change for c in found.cells} == {"earlier"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(registry_pairs())
def test_pruning_to_the_changed_gates_finds_every_cell(pair):
    """Issue 26 finding 9 (the diff at scale): evaluating only the settings where a changed
    global gate can match finds exactly the cells (step cells included) that evaluating every
    setting finds."""
    old_reg, new_reg = pair
    new_reg = copy.deepcopy(old_reg) | {"gates": new_reg["gates"]}  # only the gates differ
    texts = [yaml.safe_dump(r, sort_keys=False) for r in (old_reg, new_reg)]
    try:
        old, new = engines(*texts)
    except Exception:  # noqa: BLE001 - a drawn registry the loader refuses: nothing to compare
        return
    space = cell_space([old.registry, new.registry], modes=MODES)

    def cells(prune: bool) -> list:
        found = diff_engines(old, new, space, prune_gates=prune)
        return sorted((c.backend, c.mode, c.spec, c.old, c.new, c.when) for c in found.cells)

    assert cells(True) == cells(False)
