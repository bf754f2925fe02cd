#!/usr/bin/env python3
"""`make demo`: boot the real-kernel guest rig and run demo/guest_demo.py inside it.

Prints the demo's transcript, writes the facts to ``$DEMO_JSON`` (default
``/tmp/vfio_dp_demo.json``) and exits non-zero if any step failed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.guest.rig import GuestRigError, run_in_guest


def run_demo(timeout: float = 1500) -> tuple[int, str, dict[str, object]]:
    """(exit code, transcript, facts) of one demo run in a fresh guest."""
    res = run_in_guest('exec "$PYTHON" demo/guest_demo.py', timeout=timeout)
    facts: dict[str, object] = {}
    if "demo.json" in res.files:
        facts = json.loads(res.files["demo.json"])
    if "daemon.log" in res.files:
        facts["daemon_log"] = res.files["daemon.log"].decode(errors="replace")[-20000:]
    return res.returncode, res.stdout + res.stderr, facts


def main() -> int:
    print(
        "Booting a throwaway Linux guest (QEMU, software emulation) with an emulated Intel "
        "IOMMU and four emulated NICs; the demo runs inside it.\n",
        flush=True,
    )
    try:
        code, transcript, facts = run_demo()
    except GuestRigError as e:
        print(f"demo: the guest rig failed: {e}", file=sys.stderr)
        return 1
    print(transcript)
    out = Path(os.environ.get("DEMO_JSON", "/tmp/vfio_dp_demo.json"))
    out.write_text(json.dumps(facts, indent=1))
    print(f"(facts of every step: {out})")
    return code


if __name__ == "__main__":
    sys.exit(main())
