#!/usr/bin/env python3
"""`make demo`: boot the real-kernel guest rig and run demo/guest_demo.py inside it.

Prints the demo's transcript, writes the facts to ``$DEMO_JSON`` (default
``/tmp/vfio_dp_demo.json``) and ends with ONE verdict line, whatever fails: the guest demo's
own, or -- when the guest cannot be had, does not boot, dies, or the demo stops without one --
``VERDICT: FAIL — <where>: <why>`` written here. Exit status 0 only on PASS.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.guest.rig import (
    GuestBootError,
    GuestRigError,
    GuestRigUnavailable,
    GuestRunError,
    run_in_guest,
)

DEMO_COMMAND = 'exec "$PYTHON" demo/guest_demo.py'
_STEP = re.compile(r"^=== Step (\w+): (.*?)(?: — .*)?$", re.M)


def _last_step(transcript: str) -> str:
    """Where the demo got to: ``step N (title)`` of the last step header, else before step 1."""
    steps = _STEP.findall(transcript)
    if not steps:
        return "before step 1"
    n, title = steps[-1]
    return f"step {n} ({title.strip()})"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _fail(where: str, why: str) -> str:
    return "VERDICT: FAIL — " + " ".join(f"{where}: {why}".split())


def run_demo(
    timeout: float = 1500, command: str = DEMO_COMMAND
) -> tuple[int, str, dict[str, object]]:
    """(exit code, transcript, facts) of one demo run in a fresh guest.

    Never raises for a failure of the rig or the demo: the transcript then ends with a FAIL
    verdict naming where it stopped and why, the facts hold it under ``failures`` and
    ``verdict``, and the exit code is non-zero.
    """
    facts: dict[str, object] = {}
    try:
        res = run_in_guest(command, timeout=timeout)
    except GuestRigUnavailable as exc:
        line = _fail("before step 1 (preparing the guest rig)", str(exc))
        return 1, line + "\n", {"failures": [line], "verdict": line, "steps": {}}
    except GuestBootError as exc:
        why = f"the guest did not boot: {str(exc).splitlines()[0]}"
        line = _fail("before step 1", why)
        return 1, f"{exc}\n{line}\n", {"failures": [line], "verdict": line, "steps": {}}
    except GuestRunError as exc:
        partial = "".join(r.stdout + r.stderr for r in exc.results.values())
        partial += "".join(exc.partial.values())
        line = _fail(_last_step(partial), f"the guest stopped: {str(exc).splitlines()[0]}")
        return 1, f"{partial}\n{exc}\n{line}\n", {"failures": [line], "verdict": line}
    except GuestRigError as exc:
        line = _fail("before step 1", f"{type(exc).__name__}: {exc}")
        return 1, line + "\n", {"failures": [line], "verdict": line, "steps": {}}
    transcript = res.stdout + res.stderr
    if "demo.json" in res.files:
        facts = json.loads(res.files["demo.json"])
    if "daemon.log" in res.files:
        facts["daemon_log"] = res.files["daemon.log"].decode(errors="replace")[-20000:]
    verdicts = [ln for ln in res.stdout.splitlines() if ln.startswith("VERDICT:")]
    code = res.returncode
    if verdicts and (code == 0) == verdicts[-1].startswith("VERDICT: PASS"):
        line = verdicts[-1]
        transcript = "\n".join(
            ln for ln in transcript.splitlines() if not ln.startswith("VERDICT:")
        )
    else:
        why = f"the demo exited {code} without a verdict (last output: {_last_line(res.stderr)})"
        if verdicts:
            why = f"the demo exited {code} after '{verdicts[-1]}'"
        line = _fail(_last_step(res.stdout), why)
        failures = facts.get("failures")
        facts["failures"] = [*(failures if isinstance(failures, list) else []), line]
        code = code or 1
    facts["verdict"] = line
    return code, transcript.rstrip("\n") + "\n" + line + "\n", facts


def main() -> int:
    print(
        "Booting a throwaway Linux guest (QEMU, software emulation) with an emulated Intel "
        "IOMMU and four emulated NICs; the demo runs inside it.\n",
        flush=True,
    )
    code, transcript, facts = run_demo()
    *body, verdict = transcript.rstrip("\n").splitlines()
    print("\n".join(body))
    out = Path(os.environ.get("DEMO_JSON", "/tmp/vfio_dp_demo.json"))
    try:
        out.write_text(json.dumps(facts, indent=1))
        print(f"(facts of every step: {out})")
    except OSError as exc:
        print(f"(could not write the facts to {out}: {exc})")
    print(verdict, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
