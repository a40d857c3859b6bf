"""Check a model you already have for variable-length bugs: ``python tools/doctor.py -h``, the same command as ``ppvarlen-doctor``.

The logic lives in ppvarlen/cli.py; the package must be installed (README, Quickstart).
"""
import sys

try:
    from ppvarlen.cli import main_doctor as main
except ModuleNotFoundError as e:  # no ppvarlen, or an older one; any other module: a bug
    raise SystemExit(f"{e}: install this checkout's ppvarlen first (README, Quickstart: the "
                     f"editable install in the repository root)") if (e.name or "").split(".")[0] == "ppvarlen" else e

if __name__ == "__main__":
    sys.exit(main())
