"""`python -m kjit ...` and the `kjit` / `kjit-tune` console scripts: the kjit and kjit-tune programs
the wheel carries, so that `kjit doctor`, `python -m kjit doctor` and `kjit-tune --model
llama-3.1-8b` run exactly the code of the CLIs, with pip's NVRTC and cuBLASLt found as
`import kjit` finds them.

    python -m kjit doctor [--json]                  # or: kjit doctor
    python -m kjit tune --model llama-3.1-8b        # or: kjit-tune --model llama-3.1-8b
    python -m kjit bench --op cross_entropy ...     # any other kjit subcommand
"""

import os
import sys

from kjit import _capi


def _exec(program, args, command=None):
    """Replaces this process with the wheel's `program`. `command` is how the user typed kjit when
    not as the console scripts `kjit` and `kjit-tune`: "python -m kjit", which doctor's fixes then
    name (KJIT_COMMAND)."""
    path = _capi.NATIVE_DIR / program
    if not path.exists():
        print(f"kjit: {path} is missing from this installation; reinstall the kjit wheel",
              file=sys.stderr)
        return 1
    _capi._point_at_nvrtc()
    _capi._point_at_cublaslt()
    os.environ.setdefault("KJIT_TUNE_BIN", str(_capi.NATIVE_DIR / "kjit-tune"))
    if command:
        os.environ["KJIT_COMMAND"] = command
    else:
        os.environ.pop("KJIT_COMMAND", None)
    sys.stdout.flush()
    os.execv(str(path), [program, *args])


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    program, args = ("kjit-tune", argv[1:]) if argv[0] == "tune" else ("kjit", argv)
    return _exec(program, args, "python -m kjit")


def kjit_command():
    """The `kjit` console script."""
    return _exec("kjit", sys.argv[1:])


def kjit_tune_command():
    """The `kjit-tune` console script."""
    return _exec("kjit-tune", sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
