#!/usr/bin/env bash
# NCCL's own sum (the nccl-allreduce control) against the fixed-order
# reduction, across NCCL settings and builds, on emulated hosts: which
# settings move NCCL's bits, by how many elements and ULPs; and whether
# NCCL's reduce-scatter (the control with collective = "reduce-scatter")
# leaves each rank the slice of NCCL's own all-reduce under the same setting. Fixed-order is
# run once per W (and checked against the CPU oracle); its invariance under
# every setting is the GPU suite's job (tests/gpu_nccl.rs).
#
#   tools/nccl-drift.sh FOLDPRINT WORKDIR [SECOND_LIBNCCL]
#
# Prints a Markdown table (docs/NCCL.md) and writes WORKDIR/drift.tsv plus
# every `foldprint compare` output under WORKDIR/compare/.
set -euo pipefail
fp=$1
work=$2
alt=${3:-}
worlds=${WORLDS:-"2 4 8 16"}
mkdir -p "$work/compare"

# name|environment (space-separated KEY=VALUE, "-" for none)
settings=(
    "default|-"
    "ALGO allreduce:ring|NCCL_ALGO=allreduce:ring"
    "ALGO allreduce:tree|NCCL_ALGO=allreduce:tree"
    "PROTO Simple|NCCL_PROTO=Simple"
    "PROTO LL|NCCL_PROTO=LL"
    "PROTO LL128|NCCL_PROTO=LL128"
    "1 channel|NCCL_MIN_NCHANNELS=1 NCCL_MAX_NCHANNELS=1"
    "8 channels|NCCL_MIN_NCHANNELS=8 NCCL_MAX_NCHANNELS=8"
)
if [ -n "$alt" ]; then
    settings+=("second NCCL build|FOLDPRINT_NCCL_LIBRARY=$alt")
fi

# Two experiments with the same name and case ids, so their dumps carry
# the same file names and `foldprint compare` pairs them element by element.
experiment() { # W contract [collective]
    cat <<EOF
name = "drift"
description = "NCCL drift table: W = $1, $2 ${3:-all-reduce}"
[defaults]
world = $1
collective = "${3:-all-reduce}"
arenas = [262144, 4194304]
seed = 21
distribution = "mixed-magnitude"
[[case]]
id = "sum"
contract = "$2"
EOF
}

# "N of M elements differ ..., max ULP distance U" per arena -> "N/M, U ULP; ..."
summary() {
    if grep -q "DIFFER" "$1"; then
        sed -n 's/^  DIFFER [^:]*\.\(a[0-9]*\)\.bin: \([0-9]*\) of \([0-9]*\) elements differ.*max ULP distance \(.*\)$/\1 \2\/\3 (max \4 ULP)/p' "$1" |
            paste -sd ';' - | sed 's/;/; /g'
    else
        echo "identical"
    fi
}

run() { # W setting-env contract dumpdir [collective]
    local w=$1 envs=$2 contract=$3 dump=$4 collective=${5:-all-reduce}
    local exp="$work/drift-w$w-$contract-$collective.toml"
    experiment "$w" "$contract" "$collective" >"$exp"
    local -a e=()
    [ "$envs" = "-" ] || read -r -a e <<<"$envs"
    env "${e[@]}" "$fp" launch -n "$w" --emulate-hosts -- \
        run "$exp" --backend nccl --dump "$dump" --out "$dump.json" >"$dump.log" 2>&1
}

printf 'W\tsetting\tNCCL vs fixed-order\tNCCL vs NCCL default\tNCCL reduce-scatter vs its all-reduce\n' >"$work/drift.tsv"
echo "| W | setting | nccl-allreduce vs fixed-order (differing/elements, max ULP) | vs NCCL's default setting | NCCL's reduce-scatter vs its all-reduce (same setting) |"
echo "|---|---|---|---|---|"
for w in $worlds; do
    experiment "$w" fixed-order >"$work/cpu-w$w.toml"
    "$fp" run "$work/cpu-w$w.toml" --backend cpu --dump "$work/w$w-cpu" >/dev/null
    run "$w" - fixed-order "$work/w$w-fixed"
    "$fp" compare "$work/w$w-cpu" "$work/w$w-fixed" >"$work/compare/w$w-fixed-vs-cpu.txt" ||
        { echo "W=$w: fixed-order over NCCL differs from the CPU oracle" >&2; exit 1; }
    for s in "${settings[@]}"; do
        name=${s%%|*}
        envs=${s#*|}
        tag=$(echo "$name" | tr -c 'A-Za-z0-9\n' '_')
        dump="$work/w$w-$tag"
        run "$w" "$envs" nccl-allreduce "$dump"
        "$fp" compare "$work/w$w-fixed" "$dump" >"$work/compare/w$w-$tag-vs-fixed.txt" || true
        "$fp" compare "$work/w$w-default" "$dump" >"$work/compare/w$w-$tag-vs-default.txt" || true
        # The shards of NCCL's reduce-scatter, gathered in rank order,
        # against the all-reduce just run under the same setting.
        run "$w" "$envs" nccl-allreduce "$dump-rs" reduce-scatter
        "$fp" compare "$dump" "$dump-rs" >"$work/compare/w$w-$tag-rs-vs-ar.txt" || true
        a=$(summary "$work/compare/w$w-$tag-vs-fixed.txt")
        b=$(summary "$work/compare/w$w-$tag-vs-default.txt")
        c=$(summary "$work/compare/w$w-$tag-rs-vs-ar.txt")
        printf '%s\t%s\t%s\t%s\t%s\n' "$w" "$name" "$a" "$b" "$c" >>"$work/drift.tsv"
        echo "| $w | $name | $a | $b | $c |"
    done
done
