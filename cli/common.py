"""Shared option helpers for every vfioctl command.

Every option ``--x-y`` can also be set with the environment variable ``VFIOCTL_X_Y``
(:func:`option` derives it), options come after the subcommand, and output is ``-o table``
for people or ``-o json`` for machines. Exit codes: 0 ok, 1 failure, 2 usage error.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

if TYPE_CHECKING:
    from vfio_dp.host import Host

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


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf`` (``nan`` compares false
    with every bound, so a plain range lets it through: ``--wait-for-other nan`` would wait
    forever). Every float flag of vfioctl uses it."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(
                f"{value!r} is not a finite number: give seconds such as 30 or 0.5", param, ctx
            )
        return number


def root_option(f: F) -> F:
    return option(
        "--root",
        default="/",
        show_default=True,
        type=click.Path(file_okay=False),
        help="Filesystem root under which sys/, dev/, proc/ and the state dirs are used.",
    )(f)


#: ``-o`` values: a table for people (fitted to the terminal), ``wide`` (never cut), ``json``
#: and ``yaml`` for machines, ``name`` (one identifier a line, for scripts), as kubectl does.
OUTPUTS = ("table", "wide", "json", "yaml", "name")
MACHINE = ("json", "yaml")


def _no_headers(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    ctx.meta["vfioctl.no_headers"] = value


def default_of(options: type, field: str) -> Any:
    """The default of ``field`` in a front-end's options dataclass: a flag's default is the
    library's, written once (e.g. ``default_of(DraOptions, "metrics_port")`` is 9110)."""
    for f in dataclasses.fields(options):
        if f.name == field:
            return f.default
    raise LookupError(f"{options.__name__} has no field {field!r}")


def dir_option(flag: str, options: type, field: str, help: str) -> Callable[[F], F]:
    """A directory flag of a front-end command (a path as the process sees it, never joined
    with ``--root``), its default that of ``field`` in ``options`` (shown when there is one)."""
    default = default_of(options, field)
    return option(
        flag,
        default=default,
        show_default=default is not None,
        type=click.Path(file_okay=False),
        help=help,
    )


log_level_option = option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
log_format_option = option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="json: one JSON object per line (ts, level, logger, msg, and node, claim, uid, "
    "device where they apply), for a log pipeline.",
)


def front_end_options(
    options: type,
    *,
    node_help: str,
    config_help: str,
    resync_help: str,
    metrics_help: str,
    wait_help: str,
) -> Callable[[F], F]:
    """The flags every front-end command (``vfioctl plugin``, ``vfioctl dra-plugin``) shares,
    with the defaults of its ``options`` dataclass: the node core's (``--node-name``, also
    from ``NODE_NAME``; ``--config``, ``--root``, ``--resync``, ``--metrics-port``,
    ``--metrics-host``), then ``--create-dirs`` (for
    :func:`existing_dir`), ``--wait-for-other`` (for :func:`single_instance`),
    ``--log-level`` and ``--log-format`` (for :func:`configure_logging`)."""
    decorators = [
        option(
            "--node-name",
            envvar=[envvar_for("--node-name"), "NODE_NAME"],
            default=None,
            help=node_help,
        ),
        option(
            "--config",
            "config_path",
            type=click.Path(dir_okay=False),
            default=default_of(options, "config_path"),
            help=config_help,
        ),
        root_option,
        option(
            "--resync",
            default=default_of(options, "resync"),
            show_default=True,
            type=FiniteFloatRange(min=0.05),
            help=resync_help,
        ),
        option(
            "--metrics-port",
            default=default_of(options, "metrics_port"),
            show_default=True,
            type=click.IntRange(0, 65535),
            help=metrics_help,
        ),
        option(
            "--metrics-host",
            default=default_of(options, "metrics_host"),
            help="Address for the metrics port (default: all interfaces).",
        ),
        option(
            "--create-dirs",
            is_flag=True,
            help="Create missing kubelet directories instead of refusing them (a typo is "
            "otherwise created and waited on forever).",
        ),
        option(
            "--wait-for-other",
            default=30.0,
            show_default=True,
            type=FiniteFloatRange(0, 3600),
            help=wait_help,
        ),
        log_level_option,
        log_format_option,
    ]

    def apply(f: F) -> F:
        for decorate in reversed(decorators):
            f = decorate(f)
        return f

    return apply


def configure_logging(level: str, fmt: str = "text", node: str | None = None) -> None:
    """Log lines of a long-running command: ``<time> <LEVEL> <logger>: <message>``, or JSON
    lines with ``--log-format json`` (:mod:`vfio_dp.core.logs`; ``node`` on every line)."""
    from vfio_dp.core.logs import configure

    configure(level, fmt, node)


def output_option(f: F) -> F:
    f = option(
        "--no-headers",
        is_flag=True,
        expose_value=False,
        callback=_no_headers,
        help="Tables without their header line (for scripts).",
    )(f)
    return option(
        "-o",
        "--output",
        type=click.Choice(OUTPUTS),
        default="table",
        show_default=True,
        help="table (fits the terminal) or wide for people; json or yaml for machines; name "
        "prints one identifier a line.",
    )(f)


def printable(text: str) -> str:
    """``text`` as a person's terminal may show it: every character that is not printable
    (ESC, BEL and the other C0/C1 controls, DEL, bidi overrides, line and paragraph
    separators) as its Python escape (``\\x1b``, ``\\x07``, ``\\u202e``); newlines
    are kept (a message may have several lines). Host text — an interface name, a mount
    point from ``/proc/1/mountinfo``, a process name from ``/proc/<pid>/comm``, a pci.ids
    name, a driver name — can hold anything the kernel allows, so every print to a person
    (:func:`say`, :func:`fail`, :func:`print_table`) goes through here; ``-o json`` and
    ``-o yaml`` escape in their own syntax. The common case (all printable) costs one
    C-level check."""
    if text.isprintable():
        return text
    if "\n" in text:
        return "\n".join(printable(line) for line in text.split("\n"))
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def _escaped(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def say(message: object, err: bool = False) -> None:
    """``click.echo`` of a message for a person, host text in it shown escaped
    (:func:`printable`)."""
    click.echo(printable(str(message)), err=err)


def print_json(value: object, output: str = "json") -> None:
    """Indented for a terminal; compact (and C-encoded: 4,000 devices in milliseconds, not a
    tenth of a second) when piped to a program. ``json`` is imported here: text output
    never pays for it. ``output="yaml"`` prints the same value as YAML."""
    if output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(value, sort_keys=False, default_flow_style=False))
        return
    import json

    if sys.stdout.isatty():
        sys.stdout.write(json.dumps(value, indent=2) + "\n")
    else:
        sys.stdout.write(json.dumps(value) + "\n")


def print_names(names: Sequence[object]) -> None:
    sys.stdout.write("".join(f"{n}\n" for n in names))


def _fit(widths: list[int], total: int) -> list[int]:
    """Shrink the widest columns until a row fits ``total`` characters (never below 12)."""
    widths = list(widths)
    while sum(widths) + 2 * (len(widths) - 1) > total:
        i = max(range(len(widths)), key=lambda k: widths[k])
        if widths[i] <= 12:
            break
        widths[i] -= 1
    return widths


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, wide: bool = False
) -> None:
    """Left-aligned columns; None prints as ``-``. On a terminal, unless ``wide`` (``-o
    wide``), the widest cells are cut with ``…`` so a line fits the terminal;
    ``--no-headers`` leaves the header line out."""
    import shutil

    cells = [[("-" if c is None else printable(str(c))) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    if not wide and sys.stdout.isatty():
        widths = _fit(widths, shutil.get_terminal_size((200, 24)).columns)

    def cut(text: str, w: int) -> str:
        return text if len(text) <= w else text[: w - 1] + "…"

    out = []
    ctx = click.get_current_context(silent=True)
    if not (ctx is not None and ctx.meta.get("vfioctl.no_headers")):
        out.append(
            "  ".join(
                cut(h.upper(), widths[i]).ljust(widths[i]) for i, h in enumerate(headers)
            ).rstrip()
        )
    for row in cells:
        out.append(
            "  ".join(cut(c, widths[i]).ljust(widths[i]) for i, c in enumerate(row)).rstrip()
        )
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))


def fail(message: str, code: int = EXIT_FAIL) -> NoReturn:
    """Print ``vfioctl: <message>`` on stderr and exit with ``code``."""
    say(f"vfioctl: {message}", err=True)
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


def host_for(root: str) -> Host:
    """The :class:`~vfio_dp.host.Host` of a one-shot command on ``root``."""
    import gc

    from vfio_dp.host import Host

    # A one-shot command: what it reads lives until it exits and makes no reference cycles,
    # so the cyclic collector would only walk it again and again (~10 % of `list` on a big
    # host). Memory stays bounded by what the command reads.
    gc.disable()

    # a big host's scan may use the CPUs this process may run on (a container's cpuset)
    return Host(root, scan_processes=len(os.sched_getaffinity(0)))


def report_operations(host: Host) -> None:
    """Interrupted binds/unbinds and unreadable records, plainly, on stderr (stdout stays a
    table or JSON)."""
    found, problems = host.interrupted()
    for op in found:
        say(f"vfioctl: {op.message()}", err=True)
    for p in problems:
        say(f"vfioctl: warning: {p}", err=True)
