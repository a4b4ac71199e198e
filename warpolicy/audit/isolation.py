"""Per-subject fault isolation: one subject's device fault never takes the others down.

On CUDA a device-side assert (an index out of bounds in a kernel) or an illegal memory access
poisons the CUDA context of the whole process: every later kernel, allocation and synchronize
of that process fails. An audit that runs every subject in its own process would pay a CUDA
start per subject, so `audit_isolated` runs the subjects in **one child process, in order**,
and replaces that child only when it is lost:

* the child builds the platform and the subjects itself (a `SubjectSource` travels, never a
  tensor), audits each in turn and sends its entries back;
* after each subject it probes the device (`device_healthy`: a synchronize and one tiny
  kernel); a context that no longer works ends the child, and a fresh child resumes at the next
  subject;
* a child that dies (a crash, an abort, a signal) before sending a subject's entries leaves
  that subject, and only it, with one failed INCONCLUSIVE entry per mode naming the subject
  and how the child ended.

So a faulting subject is reported by name (exit code 3: a failed audit never passes) and every
other subject gets its own verdict. Without isolation (the simulated platform, ``isolate=False``)
the subjects run in this process, as before.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from warpolicy.audit.report import INCONCLUSIVE, AuditEntry, DynamicResult, StaticResult
from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import ForwardMode

#: Seconds the parent waits for a child's next message before it counts the child as hung
#: (a capture or a trial that never returns); generous: one subject's whole audit.
CHILD_TIMEOUT_S = 600.0

#: Builds the subjects in the child: ``(platform) -> list[AuditSubject]`` (picklable: a module
#: function or a frozen record with ``__call__``).
SubjectBuilder = Callable[[Any], Sequence[Any]]


class SubjectAuditor(Protocol):
    """Audits one subject in the child (picklable, like the builder); its results (audit
    entries, zoo rows) travel back to the parent, so they must pickle too."""

    def __call__(self, subject: Any, /) -> list[Any]: ...

    def describe(self, subject: Any, /) -> Any:
        """What the parent needs to report the subject if its process is lost (picklable)."""
        ...

    def lost(self, described: Any, why: str, /) -> list[Any]:
        """The failed results of a subject whose process was lost (``why``: how it ended)."""
        ...


@attrs.frozen
class IsolatedJob:
    """What a child needs to rebuild and audit the subjects: picklable, no tensors."""

    device: Any
    build: SubjectBuilder
    audit: SubjectAuditor
    open_platform: Callable[[Any], Any]


def device_healthy(platform: Any) -> str | None:
    """None when the device still runs work; else why not (a lost CUDA context)."""
    try:
        platform.synchronize()
        if getattr(platform, "name", "") == "cuda":
            import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

            probe = torch.ones(1, device=platform.device)
            if float((probe + 1).item()) != 2.0:
                return "the device computed 1 + 1 wrong"
    except Exception as exc:  # noqa: BLE001 - any failure here means the context is gone
        return f"{type(exc).__name__}: {_first_line(exc)}"
    return None


def _child(job: IsolatedJob, start: int, conn: Any) -> None:
    """The child process: audit subjects ``start..``, sending ``("count", n)``, then per subject
    ``("start", i, name, modes)``, ``("entries", i, entries)``, and ``("lost", i, why)`` when
    the device no longer works after subject ``i`` (the child then ends)."""
    try:
        platform = job.open_platform(job.device)
        subjects = list(job.build(platform))
        conn.send(("count", len(subjects)))
        for i in range(start, len(subjects)):
            subject = subjects[i]
            conn.send(("start", i, job.audit.describe(subject)))
            conn.send(("entries", i, job.audit(subject)))
            why = device_healthy(platform)
            if why is not None:
                conn.send(("lost", i, why))
                return
        conn.send(("done",))
    except BaseException as exc:  # noqa: BLE001 - report anything, then end the child
        conn.send(("error", f"{type(exc).__name__}: {_first_line(exc)}", traceback.format_exc()))
    finally:
        conn.close()


def audit_isolated(job: IsolatedJob) -> list[Any]:
    """Every subject's entries, in order, each subject's device fault contained (module doc)."""
    ctx = multiprocessing.get_context("spawn")  # a forked child would inherit a CUDA context
    entries: list[Any] = []
    start = 0
    count: int | None = None
    while count is None or start < count:
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_child, args=(job, start, send), daemon=True)
        child.start()
        send.close()
        current: tuple[int, Any] | None = None
        resume: int | None = None
        try:
            while True:
                if not receive.poll(CHILD_TIMEOUT_S):
                    raise EOFError(f"no answer within {CHILD_TIMEOUT_S:g} s")
                message = receive.recv()
                kind = message[0]
                if kind == "count":
                    count = message[1]
                elif kind == "start":
                    current = (message[1], message[2])
                elif kind == "entries":
                    entries += message[2]
                    current = None
                elif kind == "lost":
                    resume = message[1] + 1
                    break
                elif kind == "done":
                    resume = count
                    break
                elif kind == "error":
                    if current is None:  # the platform or the subjects could not be built
                        raise InputError(message[1])
                    entries += job.audit.lost(
                        current[1], f"the audit's process failed: {message[1]}"
                    )
                    resume = current[0] + 1
                    break
        except EOFError as exc:
            child.join(5)
            if current is None:
                if count is None:
                    raise InputError(
                        f"the audit's process ended before it started ({exc})"
                    ) from None
                raise InputError(f"the audit's process ended between subjects ({exc})") from None
            entries += job.audit.lost(current[1], _ended(child, exc))
            resume = current[0] + 1
        finally:
            receive.close()
            if child.is_alive():
                child.kill()
            child.join(5)
        start = resume if resume is not None else start + 1
    return entries


def _ended(child: Any, exc: BaseException) -> str:
    code = child.exitcode
    if code is None:
        return f"the audit's process stopped answering ({exc}); it was killed"
    if code < 0:
        return f"the audit's process was killed by signal {-code} (a device fault?)"
    return f"the audit's process exited with status {code} mid-subject (a device fault?)"


def lost_entries(name: str, modes: Sequence[ForwardMode], spec: str, why: str) -> list[AuditEntry]:
    """One failed INCONCLUSIVE entry per mode of a subject whose process was lost."""
    out = []
    for mode in modes or (ForwardMode.DECODE,):
        dynamic = DynamicResult(INCONCLUSIVE, reason=f"subject {name!r}: {why}", failed=True)
        static = StaticResult(INCONCLUSIVE, reason="not run")
        out.append(AuditEntry(name, ForwardMode.parse(mode), spec, None, None, dynamic, static))
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
