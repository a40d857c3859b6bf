#!/usr/bin/env bash
# Install Triton's perf_analyzer (the load tool for Open Inference Protocol servers) into DEST,
# from packages only: the binary ships inside PyPI's tritonclient 2.41.0 wheel (PyPI's
# perf-analyzer package is an empty placeholder); it needs Debian's libb64-0d and
# libcudart.so.12 from PyPI's nvidia-cuda-runtime-cu12, no GPU.
#   bash tools/get_perf_analyzer.sh [DEST]      (default: .perf_analyzer in this checkout)
# then: PERF_ANALYZER=DEST/perf_analyzer (a wrapper that sets LD_LIBRARY_PATH itself).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$(realpath -m "${1:-.perf_analyzer}")
py=${PYTHON:-python3}
if [ -x "$dest/perf_analyzer" ]; then echo "$dest/perf_analyzer"; exit 0; fi
if ! ldconfig -p | grep -q libb64.so.0d; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq libb64-0d >/dev/null 2>&1) || (apt-get update -qq && apt-get install -y -qq libb64-0d >/dev/null)
  else
    echo "perf_analyzer needs Debian's libb64-0d: sudo apt-get install libb64-0d" >&2; exit 1
  fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m pip download -q --no-deps -d "$work" tritonclient==2.41.0 "nvidia-cuda-runtime-cu12>=12,<13"
mkdir -p "$dest/lib"
"$py" - "$work" "$dest" <<'PY'
import glob, os, shutil, sys, zipfile
work, dest = sys.argv[1:]
with zipfile.ZipFile(glob.glob(os.path.join(work, "tritonclient-2.41.0-*.whl"))[0]) as z:
    with z.open("tritonclient-2.41.0.data/data/bin/perf_analyzer") as src, \
            open(os.path.join(dest, "perf_analyzer.bin"), "wb") as out:
        shutil.copyfileobj(src, out)
with zipfile.ZipFile(glob.glob(os.path.join(work, "nvidia_cuda_runtime_cu12-*.whl"))[0]) as z:
    name = next(n for n in z.namelist() if n.endswith("/libcudart.so.12"))
    with z.open(name) as src, open(os.path.join(dest, "lib", "libcudart.so.12"), "wb") as out:
        shutil.copyfileobj(src, out)
PY
chmod +x "$dest/perf_analyzer.bin"
cat > "$dest/perf_analyzer" <<WRAP
#!/usr/bin/env bash
LD_LIBRARY_PATH="$dest/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$dest/perf_analyzer.bin" "\$@"
WRAP
chmod +x "$dest/perf_analyzer"
"$dest/perf_analyzer" --version >/dev/null 2>&1 || "$dest/perf_analyzer" -h 2>&1 | grep -q SYNOPSIS
echo "$dest/perf_analyzer"
