"""`run_audit`: what ``warpolicy audit`` calls.

A subject comes either from a user factory (``--factory module:callable``: called with the
`Platform`, returns an `AuditSubject` or a list of them) or from the synthetic backends shipped
in `warpolicy.audit.synthetic` (``--synthetic NAME``, ``all`` for every one). Usage errors are
`WarpolicyError` subclasses raised before any device work; a run on a machine without CUDA
raises `CudaUnavailableError` (unless the simulated device is asked for).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from warpolicy.audit.dynamic import SIMULATED, audit_classes, audit_mode
from warpolicy.audit.report import AuditEntry, AuditReport
from warpolicy.audit.subject import DEFAULT_STALL_US, AuditSubject
from warpolicy.errors import CudaUnavailableError, InputError, UnknownNameError, WarpolicyError
from warpolicy.registry.inputs import parse_positive_int
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.manager import open_runtime
from warpolicy.runtime.platforms import Platform, cuda_available, device_type

#: ``--synthetic all`` audits every synthetic backend.
ALL = "all"


def run_audit(
    factory: Optional[str] = None,
    synthetic: Optional[str] = None,
    modes: Union[str, Iterable[Union[str, ForwardMode]], None] = None,
    trials: int = 50,
    stall_us: float = DEFAULT_STALL_US,
    device: Any = None,
    *,
    platform: Any = None,
    static: bool = True,
    allow_inconclusive: bool = False,
    placement: Optional[str] = None,
) -> AuditReport:
    """Audit every (backend, mode) of the chosen subject(s) and return the report.

    ``modes`` limits the modes (names, aliases or a comma-separated string); None audits every
    mode the subject has a runner for. ``device`` None means CUDA. ``platform`` (tests) skips
    the device lookup and is handed to the factory / synthetic backends as is.
    ``allow_inconclusive`` lets INCONCLUSIVE entries pass the report's exit code (a failed
    audit still does not). ``placement`` (``declared``, ``marker`` or ``derived``; synthetic
    backends only) forces where the read-done node goes (see `warpolicy.audit.synthetic`).
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
    if platform is None:
        platform = _platform(device)
    if make is not None:
        subjects = call_factory(make, factory or "", platform)
    else:
        from warpolicy.audit.synthetic import make_synthetic  # noqa: PLC0415 - deferred: imports torch

        subjects = [make_synthetic(n, platform=platform, placement=placement) for n in names]
    entries: list[AuditEntry] = []
    for subject in subjects:
        for mode in mode_list if mode_list is not None else list(subject.runners):
            entries.append(audit_mode(subject, mode, trials, stall_us, static=static))
            entries += audit_classes(subject, mode, trials, stall_us)
    return AuditReport(
        tuple(entries),
        device=describe_device(platform),
        trials=trials,
        stall_us=stall_us,
        allow_inconclusive=bool(allow_inconclusive),
    )


# ---------------------------------------------------------------------------------------------
# Argument parsing (all raise WarpolicyError subclasses, one line each)
# ---------------------------------------------------------------------------------------------


def parse_modes(
    modes: Union[str, Iterable[Union[str, ForwardMode]], None],
) -> Optional[list[ForwardMode]]:
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
    """``NAME``, ``NAME,NAME`` or ``all`` -> synthetic backend names (unknown names raise)."""
    from warpolicy.audit.synthetic import synthetic_names  # noqa: PLC0415 - deferred: imports torch

    known = synthetic_names()
    names: list[str] = []
    for name in (n.strip() for n in str(text).split(",")):
        if not name:
            continue
        if name == ALL:
            names += [n for n in known if n not in names]
        elif name in known:
            names += [name] if name not in names else []
        else:
            raise UnknownNameError("synthetic backend", name, known + [ALL])
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


def _platform(device: Any) -> Platform:
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
    "call_factory",
    "describe_device",
    "parse_modes",
    "parse_synthetic",
    "resolve_factory",
    "run_audit",
)
