"""The vocabularies every other module speaks: read-done policies, forward modes, placements
and the types of per-batch facts.

`WarReadDonePolicy` is ordered by *lateness*: a later point is always safe where an earlier
one is, so every rule in the engine is a ``max`` over these values. ``nothing`` is the bottom: a
read end that says the forward reads no scheduler-shared state at all (an explicit declaration,
never a default: an undeclared read end is ``none``, unknown, the coarse barrier).
"""

from __future__ import annotations

import enum

from warpolicy.errors import UnknownNameError


class WarReadDonePolicy(enum.IntEnum):
    """Where the forward publishes its read-done event, earliest first.

    ``NOTHING`` is a read end, not a release point: the forward reads no scheduler-shared state.
    A single forward that reads nothing publishes at ``PRE_REPLAY`` (`warpolicy.runtime.release.
    sound`); a speculative step skips a phase after its declared last reader only when that
    phase reads nothing. Any matching gate makes it a reader (every rule is a ``max``), and a
    gate's ``at_least`` is never ``nothing``.
    """

    NOTHING = -1  # reads no scheduler-shared state (declared explicitly; never a default)
    PRE_REPLAY = 0  # fresh event recorded on the forward stream just before replay()
    IN_GRAPH = 1  # event-record node planted inside the captured graph
    POST_REPLAY = 2  # fresh event recorded right after replay() is enqueued
    NONE = 3  # nothing published: the scheduler falls back to the coarse barrier

    @property
    def label(self) -> str:
        """The lowercase name used in YAML, the CLI and JSON output."""
        return self.name.lower()

    @classmethod
    def parse(cls, name: str) -> WarReadDonePolicy:
        """Parse a lowercase (or uppercase) policy name; aliases ``coarse``/``unknown`` mean NONE."""
        key = str(name).strip().lower()
        if key in _POLICY_ALIASES:
            return _POLICY_ALIASES[key]
        raise UnknownNameError("policy", str(name), policy_names())


_POLICY_ALIASES: dict[str, WarReadDonePolicy] = {p.label: p for p in WarReadDonePolicy}
_POLICY_ALIASES.update(
    {
        "coarse": WarReadDonePolicy.NONE,
        "unknown": WarReadDonePolicy.NONE,
        "in_replay": WarReadDonePolicy.IN_GRAPH,
    }
)


#: The spellings of a release point (a gate's ``at_least``): every policy but ``nothing``.
RELEASE_ALIASES: dict[str, WarReadDonePolicy] = {
    name: p for name, p in _POLICY_ALIASES.items() if p is not WarReadDonePolicy.NOTHING
}


def policy_names() -> list[str]:
    """Every read-end name, earliest first (``nothing`` included)."""
    return [p.label for p in WarReadDonePolicy]


def release_point_names() -> list[str]:
    """The names a gate's ``at_least`` takes: every policy but ``nothing``."""
    return [p.label for p in WarReadDonePolicy if p is not WarReadDonePolicy.NOTHING]


#: Module-level names for the policies, so hot paths and tables read plainly.
NOTHING = WarReadDonePolicy.NOTHING
PRE_REPLAY = WarReadDonePolicy.PRE_REPLAY
IN_GRAPH = WarReadDonePolicy.IN_GRAPH
POST_REPLAY = WarReadDonePolicy.POST_REPLAY
NONE = WarReadDonePolicy.NONE


class Placement(str, enum.Enum):
    """Where an in_graph read-done node is planted in a captured graph.

    ``MARKER``: the runner records the event right after ``graph_prep`` (the default).
    ``DERIVED``: the runner captures without a marker, walks the captured graph and adds an
    event-record node that depends on exactly the nodes that may read shared buffers.
    """

    MARKER = "marker"
    DERIVED = "derived"

    @property
    def label(self) -> str:
        return self.value


class ForwardMode(str, enum.Enum):
    """Forward modes of the anchor (SGLang), by their lowercase names.

    A ``str`` mixin: members hash and compare as their names, which keeps the per-step
    dict lookup on the C fast path (plain ``Enum.__hash__`` is a Python-level call).
    """

    DECODE = "decode"
    EXTEND = "extend"
    MIXED = "mixed"
    IDLE = "idle"
    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND = "draft_extend"
    SPLIT_PREFILL = "split_prefill"
    DLLM_EXTEND = "dllm_extend"
    PREBUILT = "prebuilt"

    @property
    def label(self) -> str:
        return self.value

    @classmethod
    def parse(cls, name: str | ForwardMode) -> ForwardMode:
        """Parse a mode name or alias (``prefill`` -> extend, ``verify`` -> target_verify)."""
        if isinstance(name, ForwardMode):
            return name
        key = str(name).strip().lower()
        mode = _MODE_ALIASES.get(key)
        if mode is None:
            raise UnknownNameError("mode", str(name), list(_MODE_ALIASES))
        return mode


_MODE_ALIASES: dict[str, ForwardMode] = {m.value: m for m in ForwardMode}
_MODE_ALIASES.update(
    {
        "prefill": ForwardMode.EXTEND,
        "verify": ForwardMode.TARGET_VERIFY,
        "draft_extend_v2": ForwardMode.DRAFT_EXTEND,
    }
)


def platform_key(name: str) -> str:
    """How a platform name is compared everywhere (a gate's ``platform:``, a context, the
    CLI's ``--platform``): case-folded, so ``CUDA`` in a registry is ``cuda`` at runtime."""
    return str(name).strip().lower()


#: The operator's kill switch (`warpolicy.registry.decision.FORCE_COARSE`) and its built-in
#: environment names: set true, every decision is ``none``. No registry, layer or plugin can
#: switch it off or invert these names (the loader refuses ``{not: NAME}`` for them).
FORCE_COARSE_NAME = "force_coarse"
FORCE_COARSE_ENV = ("WARPOLICY_FORCE_COARSE", "SGLANG_FORCE_COARSE_WAR_BARRIER")

#: The action fact a staged draft extend reports on its target verify: once it succeeded (and
#: verify published), the step's speculative runtime skips the draft extend (its shared reads
#: were copied into draft-owned buffers before verify) and releases at verify's event.
DRAFT_EXTEND_STAGED = "draft_extend_staged"

#: The modes a table covers by default: the ones where any backend can publish early.
TABLE_MODES: tuple[ForwardMode, ...] = (
    ForwardMode.DECODE,
    ForwardMode.EXTEND,
    ForwardMode.TARGET_VERIFY,
    ForwardMode.DRAFT_EXTEND,
)


def mode_names() -> list[str]:
    return list(_MODE_ALIASES)


class FactType(str, enum.Enum):
    """The type of a per-batch fact (a value known only when a batch runs).

    ``INT``: an integer, tested against thresholds (e.g. the batch's query-token count).
    ``BOOL``: true or false, set by the runner from the batch.
    ``ACTION``: whether a per-batch action the runner performs (a snapshot, a staging copy)
    succeeded; true only when the action reported success, so false, no report or an exception
    all count as false.
    ``NAME``: a name, e.g. which child a per-batch router picked.
    """

    INT = "int"
    BOOL = "bool"
    ACTION = "action"
    NAME = "name"

    @property
    def label(self) -> str:
        return self.value
