"""`python -m kjit ...`: the kjit and kjit-tune programs the wheel carries, so that `python -m kjit
doctor` and `python -m kjit tune --model llama-3.1-8b` run exactly the code of the CLIs.

    python -m kjit doctor [--json]
    python -m kjit tune --model llama-3.1-8b        # kjit-tune
    python -m kjit bench --op cross_entropy ...     # any other kjit subcommand
"""

import os
import sys

from kjit import _capi


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    program, args = ("kjit-tune", argv[1:]) if argv[0] == "tune" else ("kjit", argv)
    path = _capi.NATIVE_DIR / program
    if not path.exists():
        print(f"kjit: {path} is missing from this installation; reinstall the kjit wheel",
              file=sys.stderr)
        return 1
    _capi._point_at_nvrtc()
    _capi._point_at_cublaslt()
    os.environ.setdefault("KJIT_TUNE_BIN", str(_capi.NATIVE_DIR / "kjit-tune"))
    sys.stdout.flush()
    os.execv(str(path), [program, *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
