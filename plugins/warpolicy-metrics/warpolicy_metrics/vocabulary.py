"""Label values the metrics may carry: fixed vocabularies for what the runtime reports as text,
identifier-like values for names, and the engine's identity labels.

The runtime's observer hooks pass one-line texts (``where="fence 'decode':after_replay"``,
``reason="no read-done event"``, a demotion's whole sentence). A label holding such text makes a
series per wording and breaks every dashboard when a message changes, so each text is mapped
here to a short identifier from a fixed set; what does not map is counted as ``other`` (never
dropped). The plugin's tests (``tests/``) drive every failure path of the runtime on the simulated platform
and scans the runtime's source, and fails when something it emits maps to ``other``: a new place
or reason in the runtime must be added here.

Names the engine chooses (runner, backend, spec) become identifier-like label values
(`ident`): characters outside ``[A-Za-z0-9_.:/@+-]`` become ``_``, at most 64 characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: Characters a label value made from a name may keep; anything else becomes ``_``.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/@+-]")
MAX_VALUE_LEN = 64
#: A Prometheus label name.
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: What an identity value must look like (checked at configure time, never rewritten).
_IDENTITY_VALUE = re.compile(r"^[A-Za-z0-9_.:/@+-]{1,128}$")

OTHER = "other"

# -- policies, modes -------------------------------------------------------------------------------

#: The read-done policies, in the order of `warpolicy.registry.vocabulary.WarReadDonePolicy`.
POLICIES = ("pre_replay", "in_graph", "post_replay", "none")


def policy_label(policy: Any) -> str:
    """A policy's label (``in_graph``), or ``other``."""
    label = str(getattr(policy, "label", policy))
    return label if label in POLICIES else OTHER


def mode_label(mode: Any) -> str:
    """A forward mode's value (``decode``, ``extend``, ``target_verify``, ``draft_extend``...)."""
    return ident(getattr(mode, "value", mode))


def bucket_label(bucket: int | None) -> str:
    """A captured bucket's size, or ``eager``."""
    if bucket is None:
        return "eager"
    try:
        return str(int(bucket))
    except (TypeError, ValueError):
        return OTHER


# -- barriers ----------------------------------------------------------------------------------------

#: ``warpolicy_on_barrier``'s coarse reasons -> label. An ``event`` barrier's reason is the policy.
BARRIER_REASONS: Mapping[str, str] = {
    "forced": "forced",
    "no read-done event": "no_event",
    "hook failed": "wait_failed",  # the wait on the taken event raised
}


def barrier_reason(kind: str, reason: str) -> str:
    if kind == "event":
        return policy_label(reason)
    return BARRIER_REASONS.get(reason, OTHER)


def barrier_kind(kind: str) -> str:
    return kind if kind in ("event", "coarse") else OTHER


# -- fallbacks ---------------------------------------------------------------------------------------

#: The places a runtime component reports a fallback from (``Reporter.fallback(place, ...)``),
#: by component. ``observer``: an observer plugin raised in one of its hooks.
FALLBACK_PLACES: Mapping[str, frozenset[str]] = {
    "fence": frozenset({"prepare", "plant", "before_replay", "after_replay", "ring"}),
    "barrier": frozenset({"wait_event", "wait_stream"}),
    # per_batch / batch_*: the per-batch path (warpolicy.runtime.batch): an action hook, the
    # model's batch_facts or the per-batch rule raised
    "runner": frozenset(
        {"policy", "settle", "publish", "per_batch", "batch_action", "batch_facts", "batch_rule"}
    ),
    "overlap_loop": frozenset({"record", "wait", "barrier", "release_lead"}),
    "consistency": frozenset({"consistency"}),
    # the WAR canary's session of a runner (warpolicy.runtime.canary)
    "canary": frozenset({"begin", "observe", "check", "on_demote"}),
    # the engine API's warm-up (warpolicy.runtime.owned_capture.warm_up): its join failed
    "warm_up": frozenset({"warm_up"}),
}
COMPONENTS = (*FALLBACK_PLACES, OTHER)
PLACES = frozenset().union(*FALLBACK_PLACES.values()) | {"observer", OTHER}


def fallback_labels(where: str) -> tuple[str, str, str]:
    """``warpolicy_on_fallback``'s ``where`` -> (runner, component, place).

    ``where`` is ``"<who>:<place>"`` (``"fence 'decode':after_replay"``, ``"decode runner:policy"``,
    ``"overlap loop 'decode':record"``, ``"runner:decode:consistency"``, ``"canary 'decode':check"``) or,
    for an observer that raised,
    ``"<who>:<hook>:<plugin>"``. ``runner`` is ``""`` where the component names none.
    """
    where = str(where)
    hook_at = where.find(":warpolicy_on_")
    if hook_at >= 0:
        who, place = where[:hook_at], "observer"
    else:
        who, _, place = where.rpartition(":")
    if place == "consistency":  # who is the check's `where`: "runner:<name>" or a free name
        runner = who[len("runner:") :] if who.startswith("runner:") else ""
        return ident(runner) if runner else "", "consistency", place
    component, runner = _component(who)
    if place != "observer" and place not in FALLBACK_PLACES.get(component, ()):
        place = OTHER
    return runner, component, place


def _component(who: str) -> tuple[str, str]:
    """(component, runner) of a reporter's ``who``."""
    for prefix, component in (
        ("fence '", "fence"),
        ("barrier '", "barrier"),
        ("canary '", "canary"),
    ):
        if who.startswith(prefix) and who.endswith("'"):
            return component, ident(who[len(prefix) : -1])
    if who.endswith(" runner"):
        return "runner", ident(who[: -len(" runner")])
    if who.startswith("overlap loop '") and who.endswith("'"):  # the runner it was stepping
        return "overlap_loop", ident(who[len("overlap loop '") : -1])
    if who == "overlap loop":  # a loop that has not stepped a runner yet
        return "overlap_loop", ""
    if who == "warm-up":
        return "warm_up", ""
    return OTHER, ""


# -- demotions ---------------------------------------------------------------------------------------

#: Capture-time demotion reasons: (text the runtime's reason contains, label), first match wins.
#: The runtime words them in `warpolicy.runtime.runners.capture` and `warpolicy.runtime.placement`.
DEMOTION_REASONS: tuple[tuple[str, str], ...] = (
    ("shared reader(s) after the read-done node", "late_reader"),  # the self-check refuted it
    ("marker self-check", "self_check_failed"),  # could not run, or raised
    ("no shared reader found", "no_reader"),  # derived: the walk saw no shared reader
    ("graph-walk probe failed", "walk_failed"),
    ("derived placement failed", "derived_failed"),
    ("derived placement left the bucket unplanted", "unplanted"),  # the walk was unavailable
    ("instantiating the graph failed", "instantiate_failed"),
    ("the plant failed", "plant_failed"),
    ("marker was not recorded", "plant_failed"),  # an engine-owned capture never marked it
    ("read-done event failed", "event_failed"),  # creating or seeding the bucket's event
)
DEMOTIONS = tuple(dict.fromkeys(label for _, label in DEMOTION_REASONS)) + (OTHER,)


def demotion_reason(reason: str) -> str:
    text = str(reason)
    for needle, label in DEMOTION_REASONS:
        if needle in text:
            return label
    return OTHER


# -- names and identity ------------------------------------------------------------------------------


def ident(value: Any) -> str:
    """An identifier-like label value made from a name: unsafe characters become ``_``, at most
    `MAX_VALUE_LEN` characters; an empty name is ``unnamed``."""
    text = _UNSAFE.sub("_", str(value))[:MAX_VALUE_LEN]
    return text or "unnamed"


#: Identity label names an engine typically sets (SGLang's own metrics use the first three).
IDENTITY_EXAMPLE = ("model_name", "tp_rank", "pp_rank", "engine_id")


def identity_labels(identity: Mapping[str, Any] | None, taken: frozenset[str]) -> dict[str, str]:
    """Validate the engine's identity labels (name -> value): Prometheus label names not used by
    any metric (``taken``) nor reserved, values of 1-128 characters from ``[A-Za-z0-9_.:/@+-]``
    (numbers are written as decimals). Raises ValueError naming the first bad one."""
    out: dict[str, str] = {}
    for name, raw in (identity or {}).items():
        if not isinstance(name, str) or not _LABEL_NAME.match(name) or name.startswith("__"):
            raise ValueError(f"warpolicy-metrics: identity label name {name!r} is not a label name")
        if name in taken:
            raise ValueError(
                f"warpolicy-metrics: identity label {name!r} is already a label of the metrics "
                f"({', '.join(sorted(taken))})"
            )
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            raise ValueError(
                f"warpolicy-metrics: identity label {name}={raw!r} must be a string or an integer"
            )
        value = str(raw)
        if not _IDENTITY_VALUE.match(value):
            raise ValueError(
                f"warpolicy-metrics: identity label {name}={value!r} must be 1-128 characters "
                "from [A-Za-z0-9_.:/@+-]"
            )
        out[name] = value
    return out
