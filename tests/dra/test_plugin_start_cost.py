"""What a DRA plugin start costs in imports (issue 33, item 10): the slice publisher reads its
Node with one plain GET through the ``ApiClient`` instead of ``CoreV1Api``, whose import builds
the pydantic model of every core type (~0.7 s of CPU at every ``vfioctl dra-plugin`` start, on
the project's 2-core machine, for that one read)."""

from __future__ import annotations

import subprocess
import sys


def test_the_slice_publisher_loads_no_core_v1_api() -> None:
    code = (
        "import sys\n"
        "import kubernetes.client as k8s\n"
        "from vfio_dp.dra.apiserver.publisher import SlicePublisher\n"
        "SlicePublisher(k8s.ApiClient(), 'vfio.example.com', 'node-a', watch=False)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert "vfio_dp.dra.apiserver.publisher" in loaded
    assert "kubernetes.client.api.core_v1_api" not in loaded
    assert "kubernetes.client.models.v1_pod" not in loaded
