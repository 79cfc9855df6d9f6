#!/usr/bin/env bash
# Markdown summary of a cross-report comparison, for $GITHUB_STEP_SUMMARY.
#
#   ci/summary.sh COMPARE_JSON PROBLEMS_JSON REFERENCE [REPORT...]
#
# COMPARE_JSON is `foldprint compare --json` output; PROBLEMS_JSON a JSON
# array of further failures (missing or failing reports). One table row per
# report: which runner and combination it came from (from its file name,
# report-<runner>-<combination>.json, and its embedded provenance), what it
# ran on (CPU architecture, byte order, emulation; GPU), which libraries it
# loaded, and whether it passed its own checks.
# Then the digest differences, at most 50 of them.
set -euo pipefail

[ $# -ge 3 ] || { echo "usage: $0 COMPARE_JSON PROBLEMS_JSON REFERENCE [REPORT...]" >&2; exit 2; }
cmp=$1
problems=$2
shift 2
reference=$1

ok=$(jq -r '.ok' "$cmp")
compared=$(jq -r '.compared' "$cmp")
mismatches=$(jq -r '.mismatches | length' "$cmp")
nproblems=$(jq -r 'length' "$problems")

echo "## foldprint digests across runners and library combinations"
echo
if [ "$ok" = true ] && [ "$nproblems" -eq 0 ]; then
    echo "**PASS**: $compared case keys, identical digests in all $# reports (reference: \`$(basename "$reference")\`)."
else
    echo "**FAIL**: $mismatches digest difference(s) over $compared case keys, $nproblems other problem(s); reference: \`$(basename "$reference")\`."
fi
echo
echo "| report | runner | combination | backend | machine | GPU | driver (CUDA API) | NVRTC | NCCL | cases | own checks |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for r in "$@"; do
    base=$(basename "$r" .json)
    label=${base#report-}
    combo=$(jq -r '.environment.provenance.content.combination // "-"' "$r")
    runner=$label
    if [ "$combo" != "-" ] && [ "$label" != "${label%-"$combo"}" ]; then
        runner=${label%-"$combo"}
    fi
    jq -r --arg file "$base" --arg runner "$runner" --arg combo "$combo" '
        def cell: tostring | gsub("\\|"; "\\|") | gsub("\n"; " ");
        .environment.backend as $b
        | .environment.provenance.content as $p
        # A CPU run under a CUDA combination used none of its pins: never
        # show them as if they had run.
        | (.environment.provenance.used != false) as $used
        | .environment.host as $h
        | [ $file, $runner,
            (if $used then $combo else "\($combo) (CPU run: pins unused, not a GPU result)" end),
            (.backend // "-"),
            (if $h.arch then
                "\($h.arch)"
                + (if $h.endian then ", \($h.endian)-endian" else "" end)
                + (if $h.emulated == true then ", emulated" elif $h.emulated == false then ", native" else "" end)
             else "-" end),
            ($b.gpu.name // (if $b.threads then "cpu, \($b.threads) threads" else "-" end)),
            ($b.driver.cuda_driver_api // $b.driver.version // "-"),
            ($b.nvrtc.version // (if $used then $p.nvrtc.version else null end) // "-"),
            ($b.nccl.version // (if $used then $p.nccl.version else null end) // "-"),
            (.summary.cases // "-"),
            (if .summary.ok == true then "pass" else "**FAIL**" end) ]
        | map(cell) | "| " + join(" | ") + " |"
    ' "$r"
done

if [ "$nproblems" -gt 0 ]; then
    echo
    echo "### Problems"
    echo
    jq -r '.[] | "- " + .' "$problems"
fi
if [ "$mismatches" -gt 0 ]; then
    echo
    echo "### Digest differences"
    echo
    echo '```'
    jq -r '.mismatches[:50][]' "$cmp"
    if [ "$mismatches" -gt 50 ]; then
        echo "... and $((mismatches - 50)) more (see the uploaded comparison)"
    fi
    echo '```'
fi
