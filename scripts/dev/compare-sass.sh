#!/usr/bin/env bash
# Proves that a change to templates/rms_norm.cuh leaves the machine code alone: compiles every
# RMSNorm program of the rendered-sources golden set with two builds of kjit (no GPU needed),
# disassembles each CUBIN with cuobjdump and compares the SASS kernel by kernel.
#
#   scripts/dev/compare-sass.sh BASE_KJIT HEAD_KJIT [WORK_DIR]
#   # e.g. with main's tools copied aside before the change:
#   scripts/dev/compare-sass.sh /tmp/base/kjit build/tools/kjit /tmp/sass
#
# BASE_KJIT and HEAD_KJIT are the `kjit` executables of the two builds; the `kjit-tune` beside
# each compiles the search spaces. The programs: each preset's hidden size (2048, 3072, 3584,
# 4096, 8192; 3584 also with gemma casting) x bf16/fp16/fp32 x with and without the fused
# residual at the heuristic config, the same at hidden 4096 with casting none, and every
# candidate config of hidden 4096 bf16 and hidden 8192 fp32, each for sm_80, sm_90 and sm_100
# (ARCHS overrides). Entries are matched by their params, target and NVRTC options (the cache
# keys differ when the source text does), the /*addr*/ comments are dropped, and the rest of the
# SASS, encodings included, must be identical. WORK_DIR (default: a new temporary folder) keeps
# the two kernel caches, so a rerun with the same builds only disassembles; after rebuilding a
# side, delete its WORK_DIR/base or WORK_DIR/head (two entries for one program are refused).
# NVRTC is deterministic: a build compared with itself gives 204 CUBINs (68 programs x 3
# targets), 612 kernels, all identical; so any difference is the change's. Takes a few minutes
# per side on two cores (NVRTC), then about two for the disassembly.
#
# Needs python3 and cuobjdump: $CUOBJDUMP, else the one on PATH (CUDA's, or Triton's wheel's
# triton/backends/nvidia/bin/cuobjdump). Exit status: 0 all identical, 1 any difference or a
# program compiled on one side only, 2 a usage or tool error.
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 BASE_KJIT HEAD_KJIT [WORK_DIR]" >&2
  exit 2
fi
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [ -z "$cuobjdump" ] || [ ! -x "$cuobjdump" ]; then
  echo "compare-sass: no cuobjdump: set CUOBJDUMP or put one on PATH" >&2
  exit 2
fi
archs=${ARCHS:-sm_80,sm_90,sm_100}
work=${3:-$(mktemp -d)}
mkdir -p "$work"

# Fills the kernel cache $2 with every program of the set, compiled by the kjit executable $1.
compile_set() {
  local kjit=$1 cache=$2 tune
  tune=$(dirname "$kjit")/kjit-tune
  for tool in "$kjit" "$tune"; do
    if [ ! -x "$tool" ]; then
      echo "compare-sass: $tool is not an executable" >&2
      exit 2
    fi
  done
  mkdir -p "$cache"
  # No tuning database (every program at its heuristic or candidate config) and no eviction.
  export KJIT_CACHE_DIR=$cache KJIT_TUNING_DB=$cache/no-tuning-db.json
  export KJIT_CACHE_MAX_BYTES=$((16 << 30))
  local shape hidden casting dtype residual spec
  for shape in 2048:llama 3072:llama 3584:llama 3584:gemma 4096:llama 8192:llama 4096:none; do
    hidden=${shape%%:*} casting=${shape##*:}
    for dtype in bf16 fp16 fp32; do
      for residual in false true; do
        local flags=(--op rms_norm --hidden "$hidden" --dtype "$dtype" --casting "$casting")
        if [ "$residual" = true ]; then flags+=(--residual); fi
        "$kjit" compile "${flags[@]}" --arch "$archs" > /dev/null
      done
    done
  done
  # Every candidate of the search space, per target (hidden 4096 bf16 is the golden file's).
  for shape in 4096:bf16 8192:fp32; do
    hidden=${shape%%:*} dtype=${shape##*:}
    spec="{\"op\":\"rms_norm\",\"hidden\":$hidden,\"dtype\":\"$dtype\",\"eps\":1e-5,"
    spec+="\"weight_offset\":0,\"casting\":\"llama\",\"fused_residual\":false}"
    if ! "$tune" --compile-only --all-candidates --arch "$archs" --jobs "${JOBS:-2}" \
      --spec "$spec" > "$cache/tune-$hidden-$dtype.log" 2>&1; then
      tail -20 "$cache/tune-$hidden-$dtype.log" >&2
      echo "compare-sass: $tune failed on hidden $hidden $dtype" >&2
      exit 2
    fi
  done
}

echo "compiling with $1 into $work/base"
compile_set "$1" "$work/base"
echo "compiling with $2 into $work/head"
compile_set "$2" "$work/head"

python3 - "$cuobjdump" "$work" << 'EOF'
import json, os, re, subprocess, sys

cuobjdump, work = sys.argv[1], sys.argv[2]


def fail(message):
    print(f"compare-sass: {message}", file=sys.stderr)
    sys.exit(2)


def disassemble(side):
    """{identity: {kernel name: SASS lines}} for every cache entry of one side."""
    out = {}
    cache = os.path.join(work, side)
    cubins = os.path.join(work, side + "-cubins")
    os.makedirs(cubins, exist_ok=True)
    for name in sorted(os.listdir(cache)):
        if not name.endswith(".kjit"):
            continue
        # jit/cache_entry.h: a 32-byte header, then the metadata length (u64), the metadata JSON
        # and the code, here a CUBIN (ELF).
        data = open(os.path.join(cache, name), "rb").read()
        if data[:8] != b"KJITCACH":
            fail(f"{name} is not a kjit cache entry")
        meta_len = int.from_bytes(data[32:40], "little")
        meta = json.loads(data[40 : 40 + meta_len])
        code = data[40 + meta_len :]
        if code[:4] != b"\x7fELF":
            fail(f"{name} holds no CUBIN")
        identity = json.dumps(
            {k: meta[k] for k in ("params", "target", "options", "nvrtc_version")}, sort_keys=True)
        cubin = os.path.join(cubins, name[: -len(".kjit")] + ".cubin")
        with open(cubin, "wb") as f:
            f.write(code)
        sass = subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True,
                              text=True).stdout
        kernels, current = {}, None
        for line in sass.splitlines():
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                current = kernels.setdefault(m.group(1), [])
            elif current is not None:
                line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).strip()
                if line:
                    current.append(line)
        if not kernels:
            fail(f"no kernel in the SASS of {cubin}")
        if identity in out:
            fail(f"two entries for one program in {cache} ({identity}): it "
                     "holds another build's entries; delete it and run again")
        out[identity] = kernels
    return out


base, head = disassemble("base"), disassemble("head")
only = sorted(set(base) ^ set(head))
for identity in only:
    print(f"on one side only ({'base' if identity in base else 'head'}): {identity}")
kernels = identical = 0
for identity in sorted(set(base) & set(head)):
    b, h = base[identity], head[identity]
    for kernel in sorted(set(b) | set(h)):
        kernels += 1
        if b.get(kernel) == h.get(kernel):
            identical += 1
        else:
            print(f"differs: {kernel} in {identity}")
programs = {json.dumps(json.loads(i)["params"], sort_keys=True) for i in set(base) & set(head)}
print(f"{len(set(base) & set(head))} CUBINs ({len(programs)} programs x targets), "
      f"{kernels} kernels: {identical} identical, {kernels - identical} differ, "
      f"{len(only)} CUBINs on one side only")
sys.exit(0 if identical == kernels and not only else 1)
EOF
