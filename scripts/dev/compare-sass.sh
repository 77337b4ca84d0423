#!/usr/bin/env bash
# Proves that a change to the device templates leaves the machine code alone: compiles a set of
# RMSNorm and cross-entropy programs with two builds of kjit (no GPU needed), disassembles each
# CUBIN with cuobjdump and compares the SASS kernel by kernel.
#
#   scripts/dev/compare-sass.sh BASE_KJIT HEAD_KJIT [WORK_DIR]
#   # e.g. with main's tools copied aside before the change:
#   scripts/dev/compare-sass.sh /tmp/base/kjit build/tools/kjit /tmp/sass
#   # a change that renamed a param (the cache key's "lse_square_scale" became "z_loss"):
#   OPS=cross_entropy PARAM_RENAMES=lse_square_scale=z_loss scripts/dev/compare-sass.sh ...
#
# BASE_KJIT and HEAD_KJIT are the `kjit` executables of the two builds; the `kjit-tune` beside
# each compiles the search spaces. OPS picks the sets (default: rms_norm cross_entropy):
#   rms_norm       each preset's hidden size (2048, 3072, 3584, 4096, 8192; 3584 also with gemma
#                  casting) x bf16/fp16/fp32 x with and without the fused residual at the
#                  heuristic config, the same at hidden 4096 with casting none, and every
#                  candidate config of hidden 4096 bf16 and hidden 8192 fp32 (the golden set's);
#   cross_entropy  vocab 128256 at its heuristic config with each loss term alone and all three
#                  (label smoothing, z-loss, softcap), with argmax and entropy, with class weights,
#                  for each reduction and bf16/fp32, vocab 32000 fp16, and every candidate config
#                  of vocab 128256 bf16 (every program of each: count, forward, fused, backward,
#                  rescale);
# each for sm_80, sm_90 and sm_100 (ARCHS overrides). Entries are matched by their program's
# name, params, target and NVRTC options (the cache keys differ when the source text does), a
# param that PARAM_RENAMES names (OLD=NEW,...) counting as its new name on the base side; kernels
# by name, or by their order in the CUBIN where the names changed (a template argument's
# spelling), which the summary counts as renamed. The /*addr*/ comments are dropped, and the rest
# of the SASS, encodings included, must be identical. WORK_DIR (default: a new temporary folder)
# keeps the two kernel caches, so a rerun with the same builds only disassembles; after rebuilding
# a side, delete its WORK_DIR/base or WORK_DIR/head (two entries for one program are refused).
# NVRTC is deterministic: a build compared with itself gives 204 RMSNorm CUBINs (68 programs x 3
# targets), 612 kernels, all identical; so any difference is the change's. Takes a few minutes
# per side and op on two cores (NVRTC), then a few for the disassembly.
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
ops=${OPS:-rms_norm cross_entropy}
for op in $ops; do
  case $op in
    rms_norm | cross_entropy) ;;
    *)
      echo "compare-sass: OPS names $(printf %q "$op"); expected rms_norm and/or cross_entropy" >&2
      exit 2
      ;;
  esac
done
work=${3:-$(mktemp -d)}
mkdir -p "$work"

# Compiles every candidate config of one spec (JSON) with kjit-tune $1 into the current cache.
compile_candidates() {
  local tune=$1 spec=$2 log=$KJIT_CACHE_DIR/tune-$3.log
  if ! "$tune" --compile-only --all-candidates --arch "$archs" --jobs "${JOBS:-2}" \
    --spec "$spec" > "$log" 2>&1; then
    tail -20 "$log" >&2
    echo "compare-sass: $tune failed on $3" >&2
    exit 2
  fi
}

compile_rms_norm() {
  local kjit=$1 tune=$2 shape hidden casting dtype residual
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
    compile_candidates "$tune" "{\"op\":\"rms_norm\",\"hidden\":$hidden,\"dtype\":\"$dtype\",\
\"eps\":1e-5,\"weight_offset\":0,\"casting\":\"llama\",\"fused_residual\":false}" \
      "rms_norm-$hidden-$dtype"
  done
}

compile_cross_entropy() {
  local kjit=$1 tune=$2 dtype reduction terms
  local term_sets=("" "--label-smoothing 0.1" "--z-loss 1e-4" "--softcap 30"
    "--label-smoothing 0.1 --z-loss 1e-4 --softcap 30" "--argmax --entropy"
    "--class-weights fp32 --label-smoothing 0.1")
  for dtype in bf16 fp32; do
    for reduction in mean sum none; do
      for terms in "${term_sets[@]}"; do
        # shellcheck disable=SC2086 # terms holds several flags
        "$kjit" compile --op cross_entropy --vocab 128256 --dtype "$dtype" \
          --reduction "$reduction" $terms --arch "$archs" > /dev/null
      done
    done
  done
  "$kjit" compile --op cross_entropy --vocab 32000 --dtype fp16 --arch "$archs" > /dev/null
  compile_candidates "$tune" '{"op":"cross_entropy","vocab":128256,"dtype":"bf16",
"target_type":"int64","ignore_index":-100,"reduction":"mean","label_smoothing":0,"z_loss":0,
"softcap":0,"argmax":false}' "cross_entropy-128256-bf16"
}

# Fills the kernel cache $2 with every program of the sets OPS names, compiled by the kjit
# executable $1.
compile_set() {
  local kjit=$1 cache=$2 tune op
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
  for op in $ops; do
    "compile_$op" "$kjit" "$tune"
  done
}

echo "compiling with $1 into $work/base"
compile_set "$1" "$work/base"
echo "compiling with $2 into $work/head"
compile_set "$2" "$work/head"

python3 - "$cuobjdump" "$work" "${PARAM_RENAMES:-}" << 'EOF'
import json, os, re, subprocess, sys

cuobjdump, work, renames = sys.argv[1], sys.argv[2], sys.argv[3]


def fail(message):
    print(f"compare-sass: {message}", file=sys.stderr)
    sys.exit(2)


try:
    renamed_params = dict(pair.split("=", 1) for pair in renames.split(",") if pair)
except ValueError:
    fail(f"PARAM_RENAMES is {renames!r}; expected OLD=NEW[,OLD=NEW...]")


def disassemble(side):
    """{identity: [(kernel name, SASS lines)] in the CUBIN's order} for every entry of one side."""
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
        params = meta["params"]
        if side == "base":
            params = {renamed_params.get(k, k): v for k, v in params.items()}
        identity = json.dumps(
            {"params": params, "program": meta.get("program_name"),
             **{k: meta[k] for k in ("target", "options", "nvrtc_version")}},
            sort_keys=True)
        cubin = os.path.join(cubins, name[: -len(".kjit")] + ".cubin")
        with open(cubin, "wb") as f:
            f.write(code)
        sass = subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True,
                              text=True).stdout
        kernels = []
        for line in sass.splitlines():
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                kernels.append((m.group(1), []))
            elif kernels:
                line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).strip()
                if line:
                    kernels[-1][1].append(line)
        if not kernels:
            fail(f"no kernel in the SASS of {cubin}")
        if identity in out:
            fail(f"two entries for one program in {cache} ({identity}): it "
                 "holds another build's entries; delete it and run again")
        out[identity] = kernels
    return out


def pairs(b, h):
    """The kernels of one program matched: by name, else (names changed) by their order."""
    if sorted(n for n, _ in b) == sorted(n for n, _ in h):
        by_name = dict(h)
        return [(n, n, sass, by_name[n]) for n, sass in b]
    if len(b) == len(h):
        return [(bn, hn, bs, hs) for (bn, bs), (hn, hs) in zip(b, h)]
    return [(n, None, sass, None) for n, sass in b] + [(None, n, None, sass) for n, sass in h]


base, head = disassemble("base"), disassemble("head")
only = sorted(set(base) ^ set(head))
for identity in only:
    print(f"on one side only ({'base' if identity in base else 'head'}): {identity}")
kernels = identical = renamed = 0
for identity in sorted(set(base) & set(head)):
    for base_name, head_name, b, h in pairs(base[identity], head[identity]):
        kernels += 1
        renamed += base_name != head_name
        if b is not None and b == h:
            identical += 1
        else:
            print(f"differs: {base_name} (head: {head_name}) in {identity}")
programs = {json.dumps(json.loads(i)["params"], sort_keys=True) for i in set(base) & set(head)}
print(f"{len(set(base) & set(head))} CUBINs ({len(programs)} programs x targets), "
      f"{kernels} kernels: {identical} identical, {kernels - identical} differ, "
      f"{renamed} renamed, {len(only)} CUBINs on one side only")
sys.exit(0 if identical == kernels and not only else 1)
EOF
