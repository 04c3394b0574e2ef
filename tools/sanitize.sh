#!/usr/bin/env bash
# Build the C++ runtime with AddressSanitizer + UndefinedBehaviorSanitizer and run the runtime tests
# (and any other test files given as arguments) against it.
#
#   bash tools/sanitize.sh                         # runtime, reliability and semantics tests
#   bash tools/sanitize.sh tests/test_models.py    # or the files you name
#
# The sanitized extension is built in build-sanitize/ and used from a copy of the package in
# build-sanitize/pkg/, so the installed byoc_hetero is left alone. Python itself is not
# instrumented: libasan is preloaded, and leak detection is off (CPython keeps memory by design);
# allocator_may_return_null lets the test of a 1 PiB weight see a failed allocation, as without ASan.
# Any ASan or UBSan report fails the run (halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=build-sanitize
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g -O1"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPython_EXECUTABLE="$(command -v python3)" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" -j 2
rm -rf "$build/pkg" && mkdir -p "$build/pkg"
cp -r byoc_hetero "$build/pkg/"
find "$build" -maxdepth 1 -name '_C*.so' -exec cp {} "$build/pkg/byoc_hetero/" \;
ls "$build"/pkg/byoc_hetero/_C*.so >/dev/null
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(tests/test_runtime.py tests/test_reliability.py tests/test_semantics.py)
abs_tests=()
for t in "${tests[@]}"; do abs_tests+=("$root/$t"); done
cd "$build/pkg"   # not the repository root: the source package must not shadow the sanitized one
LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:allocator_may_return_null=1:exitcode=86" \
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=87" \
PYTHONPATH="$root/$build/pkg" \
  python3 -m pytest -q -p no:cacheprovider "${abs_tests[@]}"
