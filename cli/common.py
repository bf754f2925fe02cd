"""Shared option helpers for every vfioctl command.

Every option ``--x-y`` can also be set with the environment variable ``VFIOCTL_X_Y``
(:func:`option` derives it), options come after the subcommand, and output is ``-o table``
for people or ``-o json`` for machines. Exit codes: 0 ok, 1 failure, 2 usage error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2


def envvar_for(flag: str) -> str:
    """``--kubelet-dir`` → ``VFIOCTL_KUBELET_DIR``."""
    return "VFIOCTL_" + flag.lstrip("-").upper().replace("-", "_")


#: Flags that take devices from the host or act on every device: given on the command line
#: only. Their variables are refused (exit 2), never silently read (``VFIOCTL_DRY_RUN``, the
#: safe direction, still works).
COMMAND_LINE_ONLY = ("--force", "--all")


def _refuse_from_env(flag: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    var = envvar_for(flag)

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if os.environ.get(var) is not None:
            raise click.UsageError(
                f"{var} is set, but {flag} is never read from the environment (it is "
                f"destructive): unset {var} and pass {flag} on the command line if you mean it",
                ctx,
            )
        return value

    return check


def option(*decls: str, **kwargs: Any) -> Callable[[F], F]:
    """``click.option`` with the ``VFIOCTL_*`` env var of its long flag (none for the
    :data:`COMMAND_LINE_ONLY` flags, whose variable is refused)."""
    long_flag = next(d for d in decls if d.startswith("--")).split("/")[0]
    if long_flag in COMMAND_LINE_ONLY:
        kwargs["envvar"] = None
        kwargs["callback"] = _refuse_from_env(long_flag)
        return click.option(*decls, **kwargs)
    kwargs.setdefault("envvar", envvar_for(long_flag))
    kwargs.setdefault("show_envvar", True)
    return click.option(*decls, **kwargs)


def root_option(f: F) -> F:
    return option(
        "--root",
        default="/",
        show_default=True,
        type=click.Path(file_okay=False),
        help="Filesystem root under which sys/, dev/, proc/ and the state dirs are used.",
    )(f)


def output_option(f: F) -> F:
    return option(
        "-o",
        "--output",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="table for people, json for machines.",
    )(f)


def print_json(value: object) -> None:
    """Indented for a terminal; compact (and C-encoded: 4,000 devices in milliseconds, not a
    tenth of a second) when piped to a program. ``json`` is imported here: text output
    never pays for it."""
    import json

    if sys.stdout.isatty():
        sys.stdout.write(json.dumps(value, indent=2) + "\n")
    else:
        sys.stdout.write(json.dumps(value) + "\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Left-aligned columns; None prints as ``-``."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    line = "  ".join(h.upper().ljust(widths[i]) for i, h in enumerate(headers))
    out = [line.rstrip()]
    for row in cells:
        out.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip())
    sys.stdout.write("\n".join(out) + "\n")


def fail(message: str, code: int = EXIT_FAIL) -> NoReturn:
    """Print ``vfioctl: <message>`` on stderr and exit with ``code``."""
    click.echo(f"vfioctl: {message}", err=True)
    sys.exit(code)


def run_guarded(fn: Callable[[], int | None]) -> NoReturn:
    """Run a command body, mapping vfio_dp/vm_translate errors to messages and exit codes."""
    from vfio_dp.errors import UsageError, VfioError

    try:
        code = fn()
    except UsageError as e:
        fail(str(e), EXIT_USAGE)
    except VfioError as e:
        fail(str(e), EXIT_FAIL)
    except _translate_errors() as e:  # vm_translate's own tree
        fail(str(e), getattr(e, "exit_code", EXIT_FAIL))
    sys.exit(code or EXIT_OK)


def _translate_errors() -> tuple[type[BaseException], ...]:
    try:
        from vm_translate.errors import TranslateError
    except ImportError:  # pragma: no cover - vm_translate always ships with cli
        return ()
    return (TranslateError,)


def existing_dir(flag: str, path: str, create: bool, what: str) -> None:
    """A kubelet directory the process serves in must exist (a typo would be created and
    waited on forever); ``create`` (the ``--create-dirs`` flag) makes it instead."""
    import os

    from vfio_dp.errors import UsageError

    if os.path.lexists(path):
        return  # a directory, or something else there: the serving code says what is wrong
    if create:
        os.makedirs(path, mode=0o755, exist_ok=True)
        return
    raise UsageError(
        f"{flag} {path}: no such directory; {what}. Give the kubelet's real path (the "
        "kubelet's --root-dir, /var/lib/kubelet by default), or --create-dirs to create it"
    )


def single_instance(root: str, process: str, driver: str | None, wait: float) -> Any:
    """Hold this node's lock for ``process`` (:mod:`vfio_dp.host.instance`) for the command's
    life: a second instance waits up to ``wait`` seconds for the first to exit (saying so
    with its pid), then fails naming it."""
    import logging

    from vfio_dp.host.instance import InstanceLock, lock_name
    from vfio_dp.host.root import Root

    lock = InstanceLock(Root(root), lock_name(process, driver))

    def waiting(pid: int | None) -> None:
        logging.getLogger("vfio_dp").warning(
            "another %s of ours runs on this node%s: waiting up to %g s for it to exit",
            process,
            f" (pid {pid})" if pid else "",
            wait,
        )

    lock.acquire(wait, waiting)
    return lock
