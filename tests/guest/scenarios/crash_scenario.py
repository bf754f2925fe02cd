"""Runs INSIDE the guest (real kernel, emulated IOMMU): binds killed after every sysfs write.

The fault injector is strace, outside the code under test:

- a clean run under ``strace -f -y -P <sysfs files> -e trace=write`` lists every sysfs write
  the command makes, in order (``-P`` keeps only writes to those files, so the journal's
  own writes, stdout and logs are not counted);
- kill run k (k = 1 .. n): ``-e inject=write:signal=KILL:when=k+1`` kills the process on
  entering sysfs write k+1, i.e. right after write k; for k = n (nothing follows) the kill
  comes on the ``close`` of the file written last (``-P <that file> -e inject=close:...``).
  strace counts per thread; all sysfs writes are made by one writer thread, and no other
  thread writes (or, for the last write's file, opens) those files.

The command is the real ``vfioctl`` entry point (``cli.main.main``) in a process that
imports its modules, stops itself (SIGSTOP), gets strace attached (``strace -f -p``) and is
continued: ptrace stops on every system call, and under emulation tracing Python's start-up
would cost half a minute per run; the code under test runs entirely under strace.

After each kill: what the kernel shows, the journal and the original-driver records (each
must parse), ``vfioctl list`` (must name the interrupted operation), then recovery --
``vfioctl unbind <one address>`` for vfioctl's operations, ``Host.recover(runner="device-plugin")``
(what the daemon runs at start) for the daemon's -- and what the kernel shows after it.
Also: the state directory full (a 64 KiB tmpfs, filled) or read-only (a read-only tmpfs),
and a sysfs write that hangs (``inject=write:delay_enter``). Results go to
$GUEST_RIG_OUT/crash.json (written after every case); nothing here decides pass/fail.
``CRASH_QUICK=1`` runs a subset (the lone device's bind, ENOSPC, the hang).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
QUICK = os.environ.get("CRASH_QUICK") == "1"
LONE = "0000:01:00.0"
SHARED_A, SHARED_B = "0000:03:01.0", "0000:03:02.0"
ALL = (LONE, "0000:02:00.0", SHARED_A, SHARED_B)
STATE = "/var/lib/vfio_dp"
VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]
RECOVER_DAEMON = [
    sys.executable,
    "-c",
    "from vfio_dp.host import Host; r = Host('/', runner='device-plugin')"
    ".recover(runner='device-plugin'); "
    "print(r.recovered, r.restored, r.problems, r.skipped)",
]
WRITE_RE = re.compile(r'write\(\d+<([^>]+)>, "((?:[^"\\]|\\.)*)".*\) = (\d+)')
results: dict[str, Any] = {"cases": [], "errors": []}


def save() -> None:
    with open(os.path.join(OUT, "crash.json"), "w") as f:
        json.dump(results, f, indent=1)


def driver(addr: str) -> str | None:
    p = f"/sys/bus/pci/devices/{addr}/driver"
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None


def drivers() -> dict[str, str | None]:
    return {a: driver(a) for a in ALL}


def overrides() -> dict[str, str]:
    out = {}
    for a in ALL:
        with open(f"/sys/bus/pci/devices/{a}/driver_override") as f:
            out[a] = f.read().strip()
    return out


def run(cmd: list[str], timeout: float = 180) -> dict[str, Any]:
    """Run ``cmd``; the outputs are kept cut to their last 4,000 characters (``json_ok``
    says whether the whole stdout was JSON)."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return {
        "rc": p.returncode,
        "stdout": p.stdout[-4000:],
        "json_ok": _is_json(p.stdout),
        "stderr": p.stderr[-4000:],
        "secs": round(time.monotonic() - t0, 2),
    }


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def targets() -> list[str]:
    """Every sysfs file a bind or unbind of these devices may write (canonical paths)."""
    paths = {os.path.realpath(f"/sys/bus/pci/devices/{a}/driver_override") for a in ALL}
    paths.add("/sys/bus/pci/drivers_probe")
    for d in ("e1000e", "e1000", "vfio-pci"):
        for f in ("bind", "unbind", "new_id", "remove_id"):
            if os.path.exists(f"/sys/bus/pci/drivers/{d}/{f}"):
                paths.add(f"/sys/bus/pci/drivers/{d}/{f}")
    return sorted(paths)


def strace(paths: list[str], log: str, *spec: str) -> list[str]:
    cmd = ["strace", "-f", "-qq", "-y", "-o", log]
    for p in paths:
        cmd += ["-P", p]
    return [*cmd, *spec]


PRELOAD = {
    "cli": "cli.main, cli.host_cmds, vfio_dp.host.host, vfio_dp.host.state, vfio_dp.host.bind, "
    "vfio_dp.host.operations, vfio_dp.host.ledger, vfio_dp.host.usage, vfio_dp.host.pciids, "
    "vfio_dp.model.plan, json",
    "daemon": "cli.main, cli.deviceplugin_cmd, vfio_dp.deviceplugin.app, vfio_dp.host.host, "
    "vfio_dp.host.bind, vfio_dp.host.operations, vfio_dp.host.bind_pass, vfio_dp.host.ledger, "
    "vfio_dp.model.plan, logging, grpc",
}


def _proc_field(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split()[1]
    return ""


def traced(args: list[str], trace: list[str], *, daemon: list[str] | None = None) -> dict[str, Any]:
    """Run ``vfioctl <args>`` with ``trace`` (an strace command line) attached.

    The process imports its modules, stops itself, strace attaches to it (``-p``; ``-f``
    follows the threads it starts), then it is continued. ``daemon``: the devices the daemon
    binds; it is stopped (SIGTERM) once they are bound and the bind committed.
    """
    code = (
        "import os, signal; import "
        + PRELOAD["daemon" if daemon else "cli"]
        + "; os.kill(os.getpid(), signal.SIGSTOP); cli.main.main()"
    )
    t0 = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while _proc_field(p.pid, "State") != "T" and p.poll() is None:
        if time.monotonic() > deadline:
            p.kill()
            break
        time.sleep(0.05)  # the poll period
    tracer = subprocess.Popen([*trace, "-p", str(p.pid)])
    while _proc_field(p.pid, "TracerPid") in ("0", "") and p.poll() is None:
        if tracer.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # the poll period
    t1 = time.monotonic()
    first_err: list[float] = []
    chunks: dict[str, list[str]] = {"out": [], "err": []}

    def drain(name: str, stream: Any) -> None:  # stderr's first line is timed: the answer
        for line in stream:
            if name == "err" and not first_err:
                first_err.append(time.monotonic() - t1)
            chunks[name].append(line)

    readers = [
        threading.Thread(target=drain, args=("out", p.stdout), daemon=True),
        threading.Thread(target=drain, args=("err", p.stderr), daemon=True),
    ]
    for r in readers:
        r.start()
    os.kill(p.pid, signal.SIGCONT)
    if daemon:
        while p.poll() is None and time.monotonic() < deadline:
            bound = all(driver(a) == "vfio-pci" for a in daemon)
            said = any("bind: true: bound" in line for line in chunks["err"])  # it says so
            if bound and said and not glob.glob(f"{STATE}/ops/*.json"):
                p.send_signal(signal.SIGTERM)
                break
            time.sleep(0.2)  # the poll period
    try:
        p.wait(timeout=max(10.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    for r in readers:
        r.join(timeout=30)
    out, err = "".join(chunks["out"]), "".join(chunks["err"])
    try:
        tracer.wait(timeout=60)
    except subprocess.TimeoutExpired:
        tracer.kill()
        tracer.wait()
    return {
        "rc": p.returncode,
        "stdout": out[-4000:],
        "stderr": err[-4000:],
        "secs": round(time.monotonic() - t1, 2),
        "first_stderr_secs": round(first_err[0], 2) if first_err else None,
        "startup_secs": round(t1 - t0, 2),
    }


def sysfs_writes(log: str) -> list[tuple[str, str]]:
    """(file, data) of every completed sysfs write in an strace log, in order."""
    out = []
    with open(log) as f:
        for line in f:
            m = WRITE_RE.search(line)
            if m:
                data = m.group(2).encode().decode("unicode_escape")
                out.append((m.group(1), data))
    return out


def label(w: tuple[str, str]) -> str:
    path, data = w
    name = os.path.basename(path)
    if name in ("bind", "unbind"):
        name = f"{os.path.basename(os.path.dirname(path))}/{name}"
    shown = data.replace("\n", "\\n")
    return f"{name} <- '{shown}'"


def state_files() -> dict[str, Any]:
    """The journal and the records as found on disk; each must parse."""
    out: dict[str, Any] = {"journals": [], "records": {}, "unparsable": []}
    for p in sorted(glob.glob(f"{STATE}/ops/*.json")):
        try:
            with open(p) as f:
                out["journals"].append(json.load(f))
        except (OSError, ValueError) as e:
            out["unparsable"].append(f"{p}: {e}")
    for p in sorted(glob.glob(f"{STATE}/original/*.json")):
        try:
            with open(p) as f:
                rec = json.load(f)
            out["records"][rec["address"]] = rec["driver"]
        except (OSError, ValueError, KeyError) as e:
            out["unparsable"].append(f"{p}: {e}")
    return out


def restore_all() -> None:
    """Back to the boot state between cases, whatever happened."""
    bound = [a for a in ALL if driver(a) != ORIGINAL[a] or overrides()[a] != "(null)"]
    if bound or glob.glob(f"{STATE}/ops/*.json"):
        r = run([*VFIOCTL, "unbind", *(bound or [LONE])])
        if r["rc"] != 0:
            results["errors"].append(f"restore_all: {r['stderr']}")


# -- the commands under test ------------------------------------------------------------------
def daemon_args(addr: str) -> list[str]:
    os.makedirs("/run/crash/kd", exist_ok=True)  # the kubelet's dir exists, as on a node
    cfg = "/run/crash/config.yaml"
    with open(cfg, "w") as f:
        f.write(f'selectors:\n  - addresses: ["{addr}"]\n    resourceName: crash\n    bind: true\n')
    args = ["plugin", "--config", cfg, "--root", "/", "--kubelet-dir", "/run/crash/kd"]
    return [*args, "--metrics-port", "0", "--resync", "3600"]


def command(kind: str, addrs: list[str], trace: list[str]) -> dict[str, Any]:
    if kind == "bind":
        return traced(["bind", "--group", "-o", "json", addrs[0]], trace)
    if kind == "unbind":
        return traced(["unbind", "-o", "json", *addrs], trace)
    return traced(daemon_args(addrs[0]), trace, daemon=addrs)  # "daemon"


def prepare(kind: str, addrs: list[str]) -> None:
    restore_all()
    if kind == "unbind":  # a clean bind to undo
        r = run([*VFIOCTL, "bind", "--group", addrs[0]])
        if r["rc"] != 0:
            results["errors"].append(f"prepare unbind: {r['stderr']}")


def kill_points(area: str, kind: str, addrs: list[str], *, before_first: bool = False) -> None:
    paths = targets()
    prepare(kind, addrs)
    log = "/run/crash-dry.log"
    dry = command(kind, addrs, strace(paths, log, "-e", "trace=write", "-e", "signal=none"))
    writes = sysfs_writes(log)
    results.setdefault("dry_runs", {})[f"{area}/{kind}"] = {
        "rc": dry["rc"],
        "stderr": dry["stderr"][-1500:],
        "writes": [label(w) for w in writes],
        "secs": dry["secs"],
    }
    save()
    n = len(writes)
    points = ([0] if before_first else []) + list(range(1, n + 1))
    for k in points:
        prepare(kind, addrs)
        klog = f"/run/crash-kill-{k}.log"
        if k < n:
            spec = ["-e", "trace=write", "-e", f"inject=write:signal=KILL:when={k + 1}"]
            wrap = strace(paths, klog, *spec)
            fault = (
                f"SIGKILL after write {k} ({label(writes[k - 1])})"
                if k
                else "SIGKILL before the first sysfs write (journal written)"
            )
        else:
            last = writes[n - 1][0]
            j = sum(1 for w in writes if w[0] == last)
            spec = ["-e", "trace=write,close", "-e", f"inject=close:signal=KILL:when={j}"]
            wrap = strace([last], klog, *spec)
            fault = f"SIGKILL after write {k} ({label(writes[k - 1])}), the last"
        case: dict[str, Any] = {"area": area, "kind": kind, "k": k, "n": n, "fault": fault}
        case["run"] = command(kind, addrs, wrap)
        case["writes_made"] = [label(w) for w in sysfs_writes(klog)]
        case["drivers_after_kill"] = drivers()
        case["state_after_kill"] = state_files()
        case["list"] = run([*VFIOCTL, "list", "-o", "json"])
        if kind == "daemon":
            case["recovery"] = run(RECOVER_DAEMON)
        else:
            case["recovery"] = run([*VFIOCTL, "unbind", addrs[-1]])
        case["drivers_after_recovery"] = drivers()
        case["overrides_after_recovery"] = overrides()
        case["state_after_recovery"] = state_files()
        results["cases"].append(case)
        save()


def state_dir_refused(fault: str, mount_opts: str, fill: bool) -> None:
    restore_all()
    os.makedirs(STATE, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", mount_opts, "tmpfs", STATE], check=True)
    try:
        if fill:  # fill it to the last block
            subprocess.run(["dd", "if=/dev/zero", f"of={STATE}/fill", "bs=4k"], capture_output=True)
        log = "/run/crash-state.log"
        case: dict[str, Any] = {"area": "state dir", "kind": "bind", "fault": fault}
        case["run"] = command("bind", [LONE], strace(targets(), log, "-e", "trace=write"))
        case["writes_made"] = [label(w) for w in sysfs_writes(log)]
        case["drivers_after"] = drivers()
        case["overrides_after"] = overrides()
    finally:
        subprocess.run(["umount", STATE], check=False)
    case["state_after"] = state_files()
    results["cases"].append(case)
    save()


def hung_write() -> None:
    restore_all()
    log = "/run/crash-hang.log"
    delay = 30_000_000  # microseconds: longer than vfioctl's 10 s write timeout
    spec = ["-e", "trace=write", "-e", f"inject=write:delay_enter={delay}:when=2"]
    case: dict[str, Any] = {
        "area": "hung write",
        "kind": "bind",
        "fault": "sysfs write 2 (e1000e/unbind) hangs 30 s (strace delay_enter)",
    }
    case["run"] = command("bind", [LONE], strace(targets(), log, *spec))
    case["drivers_after"] = drivers()
    case["overrides_after"] = overrides()
    case["state_after"] = state_files()
    results["cases"].append(case)
    save()


ORIGINAL = drivers()
results["original"] = ORIGINAL
results["strace"] = run(["strace", "-V"])["stdout"].splitlines()[:1]
results["kernel"] = os.uname().release
probe = run(
    [
        sys.executable,
        "-c",
        "import os; from vfio_dp.host.root import Root, openat2_available; "
        "os.makedirs('/run/o2', exist_ok=True); r = Root('/run/o2'); "
        "os.close(r.open('/run/o2/.', os.O_RDONLY | os.O_DIRECTORY)); "
        "print(openat2_available())",
    ]
)
results["openat2"] = probe["stdout"].strip() or probe["stderr"][-500:]
save()
t_start = time.monotonic()
kill_points("lone e1000e", "bind", [LONE], before_first=True)
state_dir_refused("state dir full (ENOSPC: 64 KiB tmpfs, filled)", "size=64k", fill=True)
state_dir_refused("state dir read-only (EROFS: read-only tmpfs)", "ro", fill=False)
hung_write()
if not QUICK:
    kill_points("shared e1000 group", "bind", [SHARED_A, SHARED_B])
    kill_points("lone e1000e", "unbind", [LONE])
    kill_points("shared e1000 group", "unbind", [SHARED_A, SHARED_B])
    kill_points("lone e1000e", "daemon", [LONE])
    kill_points("shared e1000 group", "daemon", [SHARED_A, SHARED_B])
restore_all()
results["final_drivers"] = drivers()
results["secs"] = round(time.monotonic() - t_start, 1)
save()
print(f"crash scenario done in {results['secs']} s")
