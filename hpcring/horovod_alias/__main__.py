"""`python -m hpcring.horovod_alias --site-dir`: the folder to put first on PYTHONPATH (with
HPCRING_HOROVOD=1) so that ranks started by srun or mpirun resolve `import horovod` to hpcring without
`hpcring run`."""

from __future__ import annotations

import sys

from hpcring.contracts.horovod_alias import SITE_DIR


def main(argv: list[str]) -> int:
    if argv == ["--site-dir"]:
        print(SITE_DIR)
        return 0
    print("usage: python -m hpcring.horovod_alias --site-dir", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
