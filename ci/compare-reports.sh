#!/usr/bin/env bash
# Compare the foldprint reports of many runners and library combinations.
#
#   ci/compare-reports.sh [--reference FILE] [--expect N] [--junit FILE] DIR
#
# Every report-*.json under DIR is compared by case key with the reference
# (`foldprint compare`: all against the first). The reference is FILE, else
# the first report-reference*.json, else the first report in name order.
# A Markdown summary (ci/summary.sh) goes to stdout and, when the variable is
# set, is appended to $GITHUB_STEP_SUMMARY. --junit writes one testcase per
# report.
#
# --expect N: fail unless N reports besides the reference are present (a
# runner that produced no report is a failure, not a smaller comparison).
#
# Exit status: 0 every digest agrees and every report passed its own checks;
# 1 a digest differs, a report failed its own checks, or reports are missing;
# 2 bad usage or an unreadable report.
#
# FOLDPRINT names the binary (default: foldprint on PATH); jq is needed.
set -euo pipefail

usage() {
    echo "usage: $0 [--reference FILE] [--expect N] [--junit FILE] DIR" >&2
    exit 2
}

reference=""
expect=""
junit=""
while [ $# -gt 0 ]; do
    case $1 in
        --reference) [ $# -ge 2 ] || usage; reference=$2; shift 2 ;;
        --expect) [ $# -ge 2 ] || usage; expect=$2; shift 2 ;;
        --junit) [ $# -ge 2 ] || usage; junit=$2; shift 2 ;;
        -h | --help) usage ;;
        -*) usage ;;
        *) break ;;
    esac
done
[ $# -eq 1 ] || usage
dir=$1
[ -d "$dir" ] || { echo "$dir: not a directory" >&2; exit 2; }
case $expect in
    "" | *[!0-9]*) [ -z "$expect" ] || usage ;;
esac
foldprint=${FOLDPRINT:-foldprint}
here=$(cd "$(dirname "$0")" && pwd)
command -v jq >/dev/null || { echo "jq is needed" >&2; exit 2; }

mapfile -t found < <(find "$dir" -type f -name 'report-*.json' | LC_ALL=C sort)
if [ -z "$reference" ]; then
    for r in "${found[@]}"; do
        case $(basename "$r") in
            report-reference*) reference=$r; break ;;
        esac
    done
fi
if [ -z "$reference" ] && [ ${#found[@]} -gt 0 ]; then
    reference=${found[0]}
fi
[ -n "$reference" ] || { echo "no report-*.json under $dir" >&2; exit 1; }
[ -f "$reference" ] || { echo "$reference: no such report" >&2; exit 2; }

reports=("$reference")
ref_real=$(realpath "$reference")
for r in "${found[@]}"; do
    [ "$(realpath "$r")" = "$ref_real" ] || reports+=("$r")
done
others=$((${#reports[@]} - 1))

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
problems=()

if [ -n "$expect" ] && [ "$others" -ne "$expect" ]; then
    problems+=("expected $expect reports besides the reference, found $others")
    status=1
fi

if [ "$others" -ge 1 ]; then
    set +e
    "$foldprint" compare --json "${reports[@]}" >"$work/compare.json"
    rc=$?
    set -e
    case $rc in
        0) ;;
        1) status=1 ;;
        *)
            echo "foldprint compare could not read the reports (exit $rc)" >&2
            exit 2
            ;;
    esac
else
    problems+=("only the reference report is present: nothing to compare")
    status=1
    printf '{"compared":0,"ok":false,"mismatches":[]}\n' >"$work/compare.json"
fi

# Each report's own verdict (its cases and invariance groups).
jq -n '[inputs | {path: input_filename, ok: (.summary.ok == true)}]' \
    "${reports[@]}" >"$work/own.json"
while IFS= read -r r; do
    problems+=("$r failed its own checks")
    status=1
done < <(jq -r '.[] | select(.ok | not) | .path' "$work/own.json")

if [ ${#problems[@]} -gt 0 ]; then
    printf '%s\n' "${problems[@]}" | jq -R . | jq -s . >"$work/problems.json"
else
    echo '[]' >"$work/problems.json"
fi
"$here/summary.sh" "$work/compare.json" "$work/problems.json" "${reports[@]}" >"$work/summary.md"
cat "$work/summary.md"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat "$work/summary.md" >>"$GITHUB_STEP_SUMMARY"
fi

if [ -n "$junit" ]; then
    # One testcase per report: it fails when it failed its own checks or,
    # for a report other than the reference, when a digest mismatch names it.
    jq -n -r --slurpfile cmp "$work/compare.json" --slurpfile own "$work/own.json" \
        --arg ref "$reference" '
        def esc: tostring | @html;
        $cmp[0].mismatches as $m
        | [ $own[0][] as $r
            | $r + { diffs: (if $r.path == $ref then [] else [ $m[] | select(index($r.path)) ] end) } ]
          as $cases
        | ([ $cases[] | select((.diffs | length) > 0 or (.ok | not)) ] | length) as $failed
        | "<?xml version=\"1.0\" encoding=\"UTF-8\"?>",
          "<testsuites name=\"foldprint-compare\" tests=\"\($cases | length)\" failures=\"\($failed)\">",
          "  <testsuite name=\"foldprint-compare\" tests=\"\($cases | length)\" failures=\"\($failed)\">",
          ( $cases[]
            | "    <testcase classname=\"foldprint-compare\" name=\"\(.path | esc)\">",
              ( if (.diffs | length) > 0 then
                  "      <failure message=\"\(.diffs | length) digest difference(s)\">\(.diffs | join("\n") | esc)</failure>"
                elif (.ok | not) then
                  "      <failure message=\"the report failed its own checks\"/>"
                else empty end ),
              "    </testcase>" ),
          "  </testsuite>",
          "</testsuites>"
        ' >"$work/junit.xml"
    mv "$work/junit.xml" "$junit"
fi

exit "$status"
