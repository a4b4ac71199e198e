"""`run_audit`: what ``warpolicy audit`` calls.

A subject comes either from a user factory (``--factory module:callable``: called with the
`Platform`, returns an `AuditSubject` or a list of them) or from the synthetic backends shipped
in `warpolicy.audit.synthetic` (``--synthetic NAME``, ``all`` for every one). Usage errors are
`WarpolicyError` subclasses raised before any device work; a run on a machine without CUDA
raises `CudaUnavailableError` (unless the simulated device is asked for).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from warpolicy.audit.dynamic import SIMULATED, audit_classes, audit_mode
from warpolicy.audit.isolation import IsolatedJob, audit_isolated, lost_entries
from warpolicy.audit.report import AuditEntry, AuditReport
from warpolicy.audit.subject import DEFAULT_STALL_US, AuditSubject
from warpolicy.errors import CudaUnavailableError, InputError, UnknownNameError, WarpolicyError
from warpolicy.progress import NO_PROGRESS, Progress
from warpolicy.registry.inputs import parse_positive_int
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.manager import open_runtime
from warpolicy.runtime.platforms import Platform, cuda_available, device_type

#: ``--synthetic all`` audits every synthetic backend.
ALL = "all"


def run_audit(
    factory: str | None = None,
    synthetic: str | None = None,
    modes: str | Iterable[str | ForwardMode] | None = None,
    trials: int = 50,
    stall_us: float = DEFAULT_STALL_US,
    device: Any = None,
    *,
    platform: Any = None,
    static: bool = True,
    allow_inconclusive: bool = False,
    placement: str | None = None,
    progress: Progress = NO_PROGRESS,
    isolate: bool = False,
) -> AuditReport:
    """Audit every (backend, mode) of the chosen subject(s) and return the report.

    ``modes`` limits the modes (names, aliases or a comma-separated string); None audits every
    mode the subject has a runner for. ``device`` None means CUDA. ``platform`` (tests) skips
    the device lookup and is handed to the factory / synthetic backends as is.
    ``allow_inconclusive`` lets INCONCLUSIVE entries pass the report's exit code (a failed
    audit still does not). ``placement`` (``declared``, ``marker`` or ``derived``; synthetic
    backends only) forces where the read-done node goes (see `warpolicy.audit.synthetic`).
    ``progress`` hears of the subjects being built and of each (backend, mode) as it starts and
    ends (`warpolicy.progress`; the CLI prints it on stderr).
    ``isolate`` runs the subjects in a child process so a device fault (a device-side assert
    poisons the whole CUDA context) fails only the subject that met it
    (`warpolicy.audit.isolation`); ``warpolicy audit`` does so on CUDA by default
    (``--isolation``). It needs ``device`` (the child opens its own platform), not ``platform``.
    """
    if (factory is None) == (synthetic is None):
        raise InputError("give exactly one of --factory MODULE:CALLABLE or --synthetic NAME")
    trials = parse_positive_int(trials, "--trials")
    stall_us = _non_negative(stall_us, "--stall-us")
    mode_list = parse_modes(modes)
    names = parse_synthetic(synthetic) if synthetic is not None else []
    make = resolve_factory(factory) if factory is not None else None
    if placement not in (None, "declared"):
        if make is not None:
            raise InputError(
                "--placement applies to --synthetic only (a factory's runners "
                "choose their own placement)"
            )
        from warpolicy.audit.synthetic import parse_placement  # noqa: PLC0415 - deferred: imports torch

        parse_placement(placement)  # one line for a bad value, before any GPU work
    source = SubjectSource(factory, tuple(names), placement)
    auditor = ModeAuditor(None if mode_list is None else tuple(mode_list), trials, stall_us, static)
    if isolate and platform is not None:
        raise InputError("isolate=True opens the platform in a child process: give device=")
    if platform is None:
        platform = platform_for(device)
    entries: list[AuditEntry] = []
    if isolate:
        # the child process audits; progress hears of each subject's entries as they return
        progress.note("auditing in a child process (per-subject isolation)")
        job = IsolatedJob(device if device is not None else "cuda", source, auditor, platform_for)
        entries = audit_isolated(job)
        for entry in entries:
            progress.finished(f"{entry.backend} {entry.mode.label}", entry.verdict.label)
    else:
        if factory is not None:
            progress.note(f"building the subjects of {factory} (kernels may compile)")
        subjects = source(platform)
        plan = [(subject, mode) for subject in subjects for mode in auditor.modes_of(subject)]
        progress.planned(len(plan))
        for subject, mode in plan:
            label = f"{subject.name} {mode.label}"
            progress.started(label)
            found = auditor.audit(subject, mode)
            progress.finished(label, found[0].verdict.label)
            entries += found
    return AuditReport(
        tuple(entries),
        device=describe_device(platform),
        trials=trials,
        stall_us=stall_us,
        allow_inconclusive=bool(allow_inconclusive),
    )


@attrs.frozen
class SubjectSource:
    """Where the subjects come from (picklable: an isolated child rebuilds them from it)."""

    factory: str | None = None  # MODULE:CALLABLE
    synthetic: tuple[str, ...] = ()
    placement: str | None = None

    def __call__(self, platform: Any) -> list[AuditSubject]:
        if self.factory is not None:
            return call_factory(resolve_factory(self.factory), self.factory, platform)
        from warpolicy.audit.synthetic import make_synthetic  # noqa: PLC0415 - deferred: imports torch

        return [
            make_synthetic(n, platform=platform, placement=self.placement) for n in self.synthetic
        ]


@attrs.frozen
class ModeAuditor:
    """Audits every chosen mode of one subject (picklable, like `SubjectSource`)."""

    modes: tuple[ForwardMode, ...] | None  # None: every mode the subject has a runner for
    trials: int
    stall_us: float
    static: bool = True

    def modes_of(self, subject: AuditSubject) -> tuple[ForwardMode, ...]:
        return self.modes if self.modes is not None else tuple(subject.runners)

    def describe(self, subject: AuditSubject) -> tuple[str, tuple[ForwardMode, ...], str]:
        return subject.name, self.modes_of(subject), subject.spec

    def lost(
        self, described: tuple[str, tuple[ForwardMode, ...], str], why: str
    ) -> list[AuditEntry]:
        name, modes, spec = described
        return lost_entries(name, modes, spec, why)

    def audit(self, subject: AuditSubject, mode: ForwardMode) -> list[AuditEntry]:
        """The mode's entry first, then one per buffer class the subject declares."""
        entry = audit_mode(subject, mode, self.trials, self.stall_us, static=self.static)
        return [entry, *audit_classes(subject, mode, self.trials, self.stall_us)]

    def __call__(self, subject: AuditSubject) -> list[AuditEntry]:
        return [entry for mode in self.modes_of(subject) for entry in self.audit(subject, mode)]


# ---------------------------------------------------------------------------------------------
# Argument parsing (all raise WarpolicyError subclasses, one line each)
# ---------------------------------------------------------------------------------------------


def parse_modes(
    modes: str | Iterable[str | ForwardMode] | None,
) -> list[ForwardMode] | None:
    """Mode names (or one comma-separated string) -> modes, deduplicated in order."""
    if modes is None:
        return None
    raw = [modes] if isinstance(modes, str) else list(modes)
    items = [
        part for item in raw for part in (item.split(",") if isinstance(item, str) else [item])
    ]
    out: list[ForwardMode] = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            continue
        mode = ForwardMode.parse(item)  # UnknownNameError with close matches
        if mode not in out:
            out.append(mode)
    if not out:
        raise InputError("--modes is empty")
    return out


def parse_synthetic(text: str) -> list[str]:
    """``NAME``, ``NAME,NAME`` or ``all`` -> synthetic backend names, matched ignoring case as
    every backend name is (unknown names raise)."""
    from warpolicy.audit.synthetic import synthetic_names  # noqa: PLC0415 - deferred: imports torch

    known = synthetic_names()
    folded = {n.casefold(): n for n in known}
    names: list[str] = []
    for given in (n.strip() for n in str(text).split(",")):
        if not given:
            continue
        name = folded.get(given.casefold())
        if given.casefold() == ALL:
            names += [n for n in known if n not in names]
        elif name is not None:
            names += [name] if name not in names else []
        else:
            raise UnknownNameError("synthetic backend", given, known + [ALL])
    if not names:
        raise InputError("--synthetic needs a name (or 'all')")
    return names


def resolve_factory(text: str) -> Callable[..., Any]:
    """``"package.module:callable"`` (the callable may be dotted) -> the callable."""
    module_name, sep, attr = str(text).partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not sep or not module_name or not attr:
        raise InputError(
            f"--factory {text!r}: expected MODULE:CALLABLE, e.g. mypkg.audit:make_subject"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's input
        raise InputError(
            f"--factory {text!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InputError(
                f"--factory {text!r}: {module_name!r} has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise InputError(f"--factory {text!r}: {attr!r} is not callable")
    return obj


def call_factory(make: Callable[..., Any], text: str, platform: Any) -> list[AuditSubject]:
    """Call the factory with the platform; it returns one `AuditSubject` or a list of them."""
    try:
        result = make(platform)
    except WarpolicyError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's factory failed: one clear line
        raise InputError(f"--factory {text!r} failed: {type(exc).__name__}: {exc}") from None
    subjects = list(result) if isinstance(result, (list, tuple)) else [result]
    bad = [type(s).__name__ for s in subjects if not isinstance(s, AuditSubject)]
    if bad:
        raise InputError(
            f"--factory {text!r} must return an AuditSubject or a list of them, "
            f"got {', '.join(bad)}"
        )
    return subjects  # an empty list audits nothing: the report's exit code 3 says so


def _non_negative(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{what} {value!r} is not a number") from None
    if not number >= 0:
        raise InputError(f"{what} must be >= 0, got {value!r}")
    return number


# ---------------------------------------------------------------------------------------------
# Device
# ---------------------------------------------------------------------------------------------


def platform_for(device: Any) -> Platform:
    """The audit's own composition root: a plugin manager and the platform for ``device``."""
    wanted = device if device is not None else "cuda"
    if device_type(wanted) == "cuda" and not cuda_available():
        raise CudaUnavailableError(
            "warpolicy audit needs a CUDA device and none is available "
            "(torch.cuda.is_available() is False)"
        )
    return open_runtime(wanted).platform


def describe_device(platform: Any) -> str:
    """``"cuda (NVIDIA H200)"``, ``"sim (simulated: ...)"``: for the report's first line."""
    name = getattr(platform, "name", "?")
    if name in SIMULATED:
        return f"{name} (simulated: the poison lands the instant the release fires)"
    if name != "cuda":
        return name
    try:
        import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

        return f"cuda ({torch.cuda.get_device_name(platform.device)})"
    except Exception:  # noqa: BLE001 - the name is cosmetic
        return name


__all__: Sequence[str] = (
    "ALL",
    "ModeAuditor",
    "SubjectSource",
    "call_factory",
    "describe_device",
    "platform_for",
    "parse_modes",
    "parse_synthetic",
    "resolve_factory",
    "run_audit",
)
