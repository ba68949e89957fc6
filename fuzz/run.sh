#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer on STABLE Rust and runs each in turn:
#   check    the task document's parser and validator (and the metrics text reader)
#   unpack   the image unpacker: random layers of links, hard links and whiteouts must change nothing outside
#            the root they are applied to (it writes under /tmp/tyfz-PID)
#
#   fuzz/run.sh [SECONDS] [extra libFuzzer flags...]     (default 60 seconds per target)
#   FUZZ_TARGETS=unpack fuzz/run.sh 300                  (one target)
#
# cargo-fuzz needs nightly only for -Zsanitizer=address; the coverage instrumentation libFuzzer feeds on
# is LLVM's SanitizerCoverage pass, which stable rustc runs when asked with -Cpasses and -Cllvm-args. So
# this script does what `cargo fuzz run` does, minus AddressSanitizer (safe Rust needs it little; the
# core forbids unsafe code): build with the sancov flags for the host target, seed a corpus from the
# examples, run. The build is --release with debug assertions and overflow checks on, as cargo-fuzz does.
#
# Exits 0 when the time runs out with no crash; non-zero when the fuzzer finds a crash, a timeout (an
# input taking over 5 s) or an out-of-memory (over 2 GiB), leaving the input under fuzz/artifacts/TARGET/.
# Reproduce one with: fuzz/target/<host>/release/TARGET fuzz/artifacts/TARGET/<file>

set -euo pipefail

seconds="${1:-60}"
shift || true
case "$seconds" in
'' | *[!0-9]*)
    echo "usage: $0 [SECONDS] [libFuzzer flags...]" >&2
    exit 2
    ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$here"

# --target keeps RUSTFLAGS off build scripts and proc macros, which must not be instrumented (they would
# need libFuzzer's symbols at link time).
host="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
--cfg fuzzing \
-Cdebug-assertions \
-Coverflow-checks \
-Cforce-frame-pointers"
targets="${FUZZ_TARGETS:-check unpack}"
for t in $targets; do
    cargo build --release --target "$host" --bin "$t"
done

# Runs one target for the time given; exits on a finding.
run() {
    local name="$1"
    shift
    local binary="$here/target/$host/release/$name"
    local corpus="$here/corpus/$name"
    local artifacts="$here/artifacts/$name"
    mkdir -p "$corpus" "$artifacts"
    echo "fuzzing $name for ${seconds}s: $binary" >&2
    local status=0
    "$binary" "$corpus" \
        -rss_limit_mb=2048 \
        -timeout=5 \
        -max_total_time="$seconds" \
        -artifact_prefix="$artifacts/" \
        -print_final_stats=1 \
        "$@" || status=$?
    if [ "$status" -ne 0 ]; then
        echo "fuzzer $name failed (exit $status); inputs are in $artifacts:" >&2
        ls -l "$artifacts" >&2 || true
        exit "$status"
    fi
    echo "$name: no finding in ${seconds}s" >&2
}

case " $targets " in
*" unpack "*)
    run unpack -max_len=1024 -len_control=0 "$@"
    rm -rf /tmp/tyfz-*
    ;;
esac
case " $targets " in
*" check "*) ;;
*) exit 0 ;;
esac

# Seed the corpus from every example, valid and invalid (a corpus only grows; old findings are kept).
corpus="$here/corpus/check"
mkdir -p "$corpus"
while IFS= read -r -d '' f; do
    rel="${f#"$root"/examples/}"
    cp "$f" "$corpus/seed-${rel//\//-}"
done < <(find "$root/examples" -name '*.yaml' -type f -print0)

# A dictionary of YAML syntax and schema words, so mutations can splice in tokens that matter.
dict="$here/target/check.dict"
{
    for w in apiVersion kind metadata spec namePrefix projectGroup labels description type placement \
        region cluster environment image env volumes datasets models cmd compute resourceType pool workers \
        instanceSpecs countPerNode guarantee priority idleSupplement advanced precheck faultTolerance \
        exitCheckpoint metrics alarms pytorch ray head runtimeEnvYaml sharedStorage debug autoscaling \
        mountPath readOnly hidden TrainingTask trainyard.dev/v1 PyTorchJob RayJob Reserved Ondemand Spot \
        Idle queuedTooLong queuedThresholdSeconds webhook endpoints minWorkers maxWorkers pip conda \
        env_vars image_uri working_dir gpu-east-1 a100-pool gpu.a100.1 cpu.large ckpt ray-shared; do
        printf '"%s"\n' "$w"
    done
    printf '"%s"\n' ': ' '- ' '{' '}' '[' ']' ', ' '&a ' '*a' '<<: ' '!!str ' '!!binary ' '? ' '|' '>-' \
        '---' '...' '#' '~' 'null' 'true' '1e999' '-1' '.nan' '\x22' "'" '\x0a' '\x0a  ' '\x0a    - ' \
        '\x09' '\xef\xbb\xbf' '\\u0000' '%YAML 1.2' '%TAG ! tag:x:'
} >"$dict"

run check -dict="$dict" -max_len=65536 "$@"
