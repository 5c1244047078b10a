"""The images are built once per test session (ci/build-image.sh build + build-def), then many tests run
containers of them. Opt-in (HPCRING_TEST_PODMAN=1, root: .ci/run sets it); otherwise those tests skip with
the reason. The static checks in test_container_files.py and test_def2oci.py need none of this.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest
from podman_images import BUILD_TIMEOUT, Containers, build_image, skip_reason


@pytest.fixture(scope="session")
def containers() -> Iterator[Containers]:
    """Both images built (or found up to date in the layer cache); containers removed at session end."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    for step in ("build", "build-def"):
        t0 = time.monotonic()
        proc = build_image(step, timeout=BUILD_TIMEOUT)
        took = time.monotonic() - t0
        steps = [line for line in proc.stderr.splitlines() if line.startswith("[build-image ")]
        sys.stderr.write("\n" + "".join(f"{line}\n" for line in steps))
        sys.stderr.write(f"[podman] ci/build-image.sh {step}: rc={proc.returncode} in {took:.0f} s\n")
        if proc.returncode != 0:
            tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
            pytest.fail(f"ci/build-image.sh {step} failed ({proc.returncode}):\n{tail}")
    session = Containers()
    stale = session.reap_stale()
    if stale:
        sys.stderr.write(f"\n[podman] removed containers of killed sessions: {' '.join(stale)}\n")
    try:
        yield session
    finally:
        left = session.remove_all()
        if left:
            sys.stderr.write(f"\n[podman] removed containers left running: {' '.join(left)}\n")
