#!/bin/sh
# What users link ships no tuner: libkjit.a must define no fp64 reference, trial, op trait or
# registry symbol (the registry's functions take the spec variant, OpSpec). The same check on
# libkjit_tuning.a, where they all are, must find them, or the check itself is broken.
#   user_library_symbols.sh <libkjit.a> <libkjit_tuning.a>
set -eu
user_library=$1
tuning_library=$2
pattern='Reference\(|Trial\b|OpTrait<|kjit::ops::[A-Za-z]+\(.*std::variant<|kjit::ops::OpNames\('

# The demangled names of the symbols the archive defines, those of the tuner's side alone.
tuner_symbols() {
  nm -C --defined-only "$1" | awk '$2 ~ /^[A-Za-z]$/ { $1 = ""; $2 = ""; print substr($0, 3) }' |
    grep -E "$pattern" | sort -u || true
}

found=$(tuner_symbols "$user_library")
if [ -n "$found" ]; then
  echo "$user_library defines symbols of the tuner's side (they belong in libkjit_tuning):"
  echo "$found" | head -n 20
  exit 1
fi
if [ -z "$(tuner_symbols "$tuning_library")" ]; then
  echo "the check finds no reference, trial or registry symbol in $tuning_library either: broken"
  exit 1
fi
echo "$user_library: no reference, trial or registry symbol"
