#!/usr/bin/env bash
# The CPU oracle on other CPU architectures, run by .ci/run and by
# .github/workflows/cross-arch.yml. For each target it cross-builds foldprint and
# its tests, runs `foldprint verify experiments --golden experiments/golden
# --backend cpu` under qemu-user, runs the unit and integration tests under
# qemu-user, and finally compares every architecture's report with the
# native one (ci/compare-reports.sh), by case key and digest.
#
#   ci/cross-arch.sh [--target TRIPLE]...     (default: all four below)
#
#   aarch64-unknown-linux-gnu       64-bit Arm, little-endian
#   s390x-unknown-linux-gnu         IBM Z, big-endian
#   powerpc64le-unknown-linux-gnu   POWER, little-endian
#   riscv64gc-unknown-linux-gnu     RISC-V, little-endian
#
# It installs what it needs: from Debian qemu-user, gcc-<arch>-linux-gnu,
# libc6-dev-<arch>-cross and jq; from rustup each target's standard
# library. When one of them cannot be installed it stops with exit 3 and
# says which: a target is never skipped.
#
# All targets build in one cargo run (so both cores of a small machine stay
# busy) with the profile `cross`: the release profile without debug info. The
# binary is the release binary; only the dependencies that tests alone use
# (regex, proptest, ...; none of them is in the binary) are left unoptimized
# to save compile time. Builds land under target/<triple>/cross/, so a
# second run only rebuilds what changed. Then every target is verified and
# tested under qemu-user, all at once.
#
# Tests that cannot work under qemu-user are excluded by exact name (see
# EXCLUDED below; each is printed with its reason). They all run natively in
# .ci/run. A test that is renamed stops being excluded and fails under
# qemu-user, loudly.
#
# FOLDPRINT names the native binary for the reference report (default
# target/release/foldprint, built if missing).
#
# Written under target/cross-arch/: reports/report-*.json (one per
# architecture; report-reference-<machine>.json is the native one),
# summary.md (the comparison), logs/ (build, verify and test output).
#
# Exit status: 0 every target built, verified, passed its tests and agrees
# with the native report; 1 something failed; 3 a tool, package or standard
# library is missing and could not be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

all_targets=(
    aarch64-unknown-linux-gnu
    s390x-unknown-linux-gnu
    powerpc64le-unknown-linux-gnu
    riscv64gc-unknown-linux-gnu
)

# triple -> "rust-arch endian uname-machine debian-arch gnu-prefix qemu"
declare -A spec=(
    [aarch64-unknown-linux-gnu]="aarch64 little aarch64 arm64 aarch64-linux-gnu aarch64"
    [s390x-unknown-linux-gnu]="s390x big s390x s390x s390x-linux-gnu s390x"
    [powerpc64le-unknown-linux-gnu]="powerpc64 little ppc64le ppc64el powerpc64le-linux-gnu ppc64le"
    [riscv64gc-unknown-linux-gnu]="riscv64 little riscv64 riscv64 riscv64-linux-gnu riscv64"
)

# Tests excluded under qemu-user, as "binary::exact-name  reason".
reason_exec="starts foldprint itself as a child process; under qemu-user that is a foreign binary the host kernel cannot execute (Exec format error) unless binfmt_misc is set up for it, a machine-wide setting this script does not change"
reason_host_libs="reads the build machine's x86-64 loader cache and stand-in driver libraries built by its gcc, while the emulated process rightly accepts only libraries of its own architecture"
EXCLUDED=(
    "lib::audit::child::tests::exit_codes_output_and_timeouts  expects spawning a missing program to fail in the parent; qemu-user runs glibc's posix_spawn (clone with CLONE_VFORK) as a plain fork, so the exec error stays in the child, which exits 127"
    "reports::audit::a_child_that_rejects_its_arguments_is_exit_2  $reason_exec"
    "reports::audit::a_configuration_that_changes_digests_fails_and_names_the_cells  $reason_exec"
    "reports::audit::a_pinned_library_the_run_did_not_load_is_a_mismatch  $reason_exec"
    "reports::audit::the_library_check_accepts_the_requested_file_and_rejects_another  $reason_exec"
    "reports::audit::the_cpu_matrix_passes_and_records_every_configuration  $reason_exec"
    "reports::audit::the_oracle_reads_the_same_rank_files_and_tensors  $reason_exec"
    "reports::audit::an_audit_matrix_over_16_bit_experiments_runs_on_the_cpu  $reason_exec"
    "cli::commands::launch_propagates_the_first_failure_and_names_the_rank  $reason_exec"
    "cli::exit_codes::a_closed_stdout_pipe_is_not_a_panic  $reason_exec"
    "cli::exit_codes::a_full_stdout_is_a_clear_error  $reason_exec"
    "cli::exit_codes::a_thread_pool_that_cannot_start_is_exit_3  $reason_exec"
    "cli::exit_codes::memory_checks_honour_the_address_space_limit  $reason_exec"
    "cli::rank_files::rank_files_larger_than_memory_allows_are_refused_before_running  $reason_exec"
    "cli::rank_files::bench_inputs_reads_the_generators_values_from_files_and_times_whole_cases  $reason_exec"
    "cli::readme::the_sample_output_is_what_the_code_prints  $reason_exec"
    "cli::progress::piped_rows_stream_as_cases_finish  $reason_exec"
    "cli::progress::reports_record_the_git_commit  $reason_exec"
    "cli::progress::a_terminal_shows_progress_while_a_long_case_runs  $reason_exec"
    "cli::outputs::sigint_stops_at_a_case_boundary_and_keeps_old_outputs  $reason_exec"
    "cli::outputs::sigterm_stops_at_a_case_boundary_and_keeps_old_outputs  $reason_exec"
    "platform::host_driver::doctor_finds_and_loads_the_driver_by_path_when_the_loader_cannot  $reason_exec"
    "reports::audit::sigterm_stops_the_child_removes_the_work_dir_and_exits_143  $reason_exec"
    "reports::audit::sigint_and_sighup_stop_the_audit_the_same_way  $reason_exec"
    "cli::commands::help_to_a_full_device_fails  $reason_exec"
    "cli::progress::piped_verify_rows_stream_as_cases_finish  $reason_exec"
    "cli::outputs::a_tight_address_space_limit_refuses_and_never_aborts  $reason_exec"
    "cli::hostile_inputs::fifo_experiment_report_and_golden_are_refused_without_hanging  $reason_exec"
    "cli::hostile_inputs::fifo_bin_in_a_dump_directory_is_refused_without_hanging  $reason_exec"
    "cli::hostile_inputs::dump_to_a_symlink_with_a_trailing_slash_is_refused  $reason_exec"
    "cli::hostile_inputs::concurrent_runs_on_the_same_outputs_never_mix  $reason_exec"
    "cli::hostile_inputs::bin_symlinked_to_dev_zero_is_refused  $reason_exec"
    "cli::hostile_inputs::a_late_sigint_never_both_refuses_and_writes  $reason_exec"
    "cli::launchers::world_under_launch_lists_every_rank  $reason_exec"
    "cli::launchers::a_rank_killed_mid_rendezvous_ends_the_others_in_seconds  $reason_exec"
    "cli::launchers::a_stopped_rank_zero_stops_waiting_and_its_peer_hears_of_it  $reason_exec"
    "cli::launchers::a_foldprint_rank_under_launch_exec_sees_torchrun_agree  $reason_exec"
    "cli::hostile_peers::a_dripping_client_does_not_hold_rank_zero_past_a_signal  $reason_exec"
    "cli::hostile_peers::a_dripping_client_does_not_hold_rank_zero_past_its_deadline  $reason_exec"
    "cli::hostile_peers::a_fake_rank_zero_learns_nothing_and_the_peer_fails_at_once  $reason_exec"
    "cli::hostile_peers::a_fake_rank_zero_that_drips_does_not_stall_the_peer  $reason_exec"
    "cli::hostile_peers::a_recorded_handshake_replayed_is_refused_both_ways  $reason_exec"
    "cli::hostile_peers::a_token_holder_cannot_join_as_another_rank_than_its_own  $reason_exec"
    "cli::hostile_peers::idle_and_dripping_connections_do_not_delay_the_real_rank  $reason_exec"
    "cli::launchers_setup::a_directory_rendezvous_leaves_nothing_behind_and_the_next_job_with_its_id_meets  $reason_exec"
    "cli::launchers_setup::a_killed_jobs_files_neither_pass_a_peer_nor_stop_the_next_job  $reason_exec"
    "cli::launchers_setup::a_stopped_rank_zero_ends_a_directory_rendezvous_on_every_rank_and_cleans_up  $reason_exec"
    "cli::launchers_setup::launch_inside_another_launchers_job_uses_its_own_ranks  $reason_exec"
    "cli::launchers_setup::launcher_values_out_of_range_exit_2_naming_the_variable  $reason_exec"
    "cli::launchers_setup::launchers_that_agree_are_named_in_the_world  $reason_exec"
    "cli::launchers_setup::launchers_that_disagree_are_refused_naming_both  $reason_exec"
    "cli::launchers_setup::rank_zero_refuses_an_address_it_cannot_listen_on  $reason_exec"
    "cli::verdicts::a_signal_ends_the_wait_for_another_runs_output_lock  $reason_exec"
    "cli::verdicts::a_second_signal_leaves_no_lock_file  $reason_exec"
    "cli::inputs::a_grid_cell_of_any_width_prints  $reason_exec"
    "platform::host_driver::the_loader_cache_leads_to_a_driver_directory_nothing_else_names  $reason_host_libs"
    "platform::host_driver::the_running_kernel_module_picks_its_own_libcuda_over_a_stale_one  $reason_host_libs"
    "platform::host_driver::the_confidential_computing_libraries_are_loaded_beside_libcuda  $reason_host_libs"
    "platform::host_driver::wsl_libcuda_is_loaded_with_its_libdxcore_or_the_missing_one_is_named  $reason_host_libs"
    "lib::gpu::host_driver::tests::cache_parser_agrees_with_ldconfig  $reason_host_libs"
)

usage() {
    echo "usage: $0 [--target TRIPLE]..." >&2
    echo "targets: ${all_targets[*]}" >&2
    exit 2
}

targets=()
while [ $# -gt 0 ]; do
    case $1 in
        --target)
            [ $# -ge 2 ] || usage
            [ -n "${spec[$2]:-}" ] || { echo "cross-arch: unknown target $2" >&2; usage; }
            targets+=("$2")
            shift 2
            ;;
        -h | --help) usage ;;
        *) usage ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

step() { echo "-- $*"; }
missing_resource() {
    echo "cross-arch: $*" >&2
    exit 3
}
ci_name="cross-arch"
# shellcheck source=ci/lib.sh
source ci/lib.sh
elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

start_all=$SECONDS
out=target/cross-arch
rm -rf "$out/reports" "$out/logs" "$out/status"
mkdir -p "$out/reports" "$out/logs" "$out/status"

# --- tools ---------------------------------------------------------------------
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
packages=(qemu-user jq)
for t in "${targets[@]}"; do
    read -r _ _ _ debarch prefix _ <<<"${spec[$t]}"
    packages+=("gcc-$prefix" "libc6-dev-$debarch-cross")
done
missing=()
for p in "${packages[@]}"; do
    installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    step "installing from Debian: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq || missing_resource "apt-get update failed"
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || missing_resource "could not install ${missing[*]} from Debian"
fi
for t in "${targets[@]}"; do
    read -r _ _ _ _ prefix qemu <<<"${spec[$t]}"
    command -v "$prefix-gcc" >/dev/null || missing_resource "$prefix-gcc not found after installing gcc-$prefix"
    command -v "qemu-$qemu" >/dev/null || missing_resource "qemu-$qemu not found after installing qemu-user"
    [ -d "/usr/$prefix/lib" ] || missing_resource "/usr/$prefix/lib (the target's C library) not found"
done

# Each target's Rust standard library. .ci/run may have linked the pinned
# toolchain name to `stable` of the same version; rustup adds nothing to a
# linked toolchain, so the targets then go into the toolchain it points at.
sysroot=$(rustc --print sysroot)
need_std=()
for t in "${targets[@]}"; do
    [ -d "$sysroot/lib/rustlib/$t/lib" ] || need_std+=("$t")
done
if [ ${#need_std[@]} -gt 0 ]; then
    step "rustup target add ${need_std[*]}"
    if ! rustup target add "${need_std[@]}"; then
        pinned=$(rustc --version | awk '{print $2}')
        if [ "$(rustup run stable rustc --version 2>/dev/null | awk '{print $2}')" = "$pinned" ]; then
            step "rustup target add --toolchain stable ${need_std[*]} (stable is $pinned too)"
            rustup target add --toolchain stable "${need_std[@]}" || true
        fi
    fi
    for t in "${need_std[@]}"; do
        [ -d "$sysroot/lib/rustlib/$t/lib" ] \
            || missing_resource "the Rust standard library for $t is not installed and rustup could not install it into $(rustc --version); this step does not skip a target"
    done
fi
read -r _ _ _ _ _ qemu <<<"${spec[${targets[0]}]}"
step "tools: $(rustc --version); $(qemu-"$qemu" --version | awk "NR == 1")"

# --- the native reference ---------------------------------------------------------
foldprint=${FOLDPRINT:-target/release/foldprint}
if ! [ -x "$foldprint" ]; then
    step "building $foldprint for the reference report"
    cargo build --release --locked --quiet
fi
native=$(uname -m)
reference=$out/reports/report-reference-$native.json
step "native reference: $foldprint verify on $native"
if ! "$foldprint" verify experiments --golden experiments/golden --backend cpu \
    --out "$reference" >"$out/logs/native.verify.log" 2>&1; then
    tail -n 20 "$out/logs/native.verify.log" >&2
    echo "cross-arch: the native binary does not verify against the goldens" >&2
    native_ok=false
else
    native_ok=true
fi

# --- per target ----------------------------------------------------------------------
profile=(--config 'profile.cross.inherits="release"' --config 'profile.cross.debug=0' --profile cross)
# Dependencies of the tests only (`cargo tree -e normal` does not list them):
# unoptimized, they compile in a fraction of the time.
for p in aho-corasick bstr difflib predicates proptest regex regex-automata regex-syntax rustix; do
    profile+=(--config "profile.cross.package.$p.opt-level=0")
done

skip_args=()
for e in "${EXCLUDED[@]}"; do
    name=${e%%  *}
    skip_args+=(--skip "${name#*::}")
done

target_env() {
    local t=$1 upper
    read -r _ _ _ _ prefix qemu <<<"${spec[$t]}"
    upper=$(tr '[:lower:]-' '[:upper:]_' <<<"$t")
    export "CARGO_TARGET_${upper}_LINKER=$prefix-gcc"
    # The runner also reaches assert_cmd, which starts the binary under test
    # through it (CARGO_TARGET_<TRIPLE>_RUNNER).
    export "CARGO_TARGET_${upper}_RUNNER=qemu-$qemu -L /usr/$prefix"
}

# Verify and test one built target; writes one line to $out/status/<triple>.
check_target() {
    local t=$1 t0 ok=true line report rc
    read -r arch endian machine _ prefix qemu <<<"${spec[$t]}"
    target_env "$t"
    report=$out/reports/report-$machine-qemu.json
    line="$t ($arch, $endian-endian, qemu-$qemu): build ok ($(wc -l <"$out/logs/$t.tests") test executables, $2)"

    t0=$SECONDS
    if timeout 1200 "qemu-$qemu" -L "/usr/$prefix" "target/$t/cross/foldprint" verify experiments \
        --golden experiments/golden --backend cpu --out "$report" \
        >"$out/logs/$t.verify.log" 2>&1; then
        line+="; verify ok: $(sed -n 's/^verify ok: //p' "$out/logs/$t.verify.log") ($(elapsed $((SECONDS - t0))))"
    else
        rc=$?
        ok=false
        line+="; verify FAILED (exit $rc, $(elapsed $((SECONDS - t0))), see $out/logs/$t.verify.log)"
    fi

    # The report must say where it ran: this architecture and byte order,
    # under emulation (unknown only on kernels without /proc/sys/kernel/arch).
    if [ -s "$report" ]; then
        local host
        host=$(jq -c '.environment.host | {arch, endian, machine, kernel_arch, emulated}' "$report")
        if ! jq -e --arg a "$arch" --arg e "$endian" --arg m "$machine" '
            .arch == $a and .endian == $e and .machine == $m
            and (.emulated == true or (.emulated == null and .kernel_arch == null))' \
            <<<"$host" >/dev/null; then
            ok=false
            line+="; report host block WRONG: $host"
        fi
    fi

    # The test executables of the build, each run under qemu-user (not
    # through cargo, whose lock on target/ the next build holds meanwhile).
    t0=$SECONDS
    local exe tests_ok=true
    : >"$out/logs/$t.test.log"
    while IFS= read -r exe; do
        echo "     Running $exe" >>"$out/logs/$t.test.log"
        if ! timeout 1200 "qemu-$qemu" -L "/usr/$prefix" "$exe" --exact "${skip_args[@]}" \
            >>"$out/logs/$t.test.log" 2>&1; then
            tests_ok=false
        fi
    done <"$out/logs/$t.tests"
    if ! [ -s "$out/logs/$t.tests" ]; then
        tests_ok=false
        echo "no test executables were built" >>"$out/logs/$t.test.log"
    fi
    if $tests_ok; then
        line+="; tests ok"
    else
        ok=false
        line+="; tests FAILED (see $out/logs/$t.test.log)"
    fi
    line+=": $(awk '/^test result:/ {p += $4; f += $6; x += $12}
        END {printf "%d passed, %d failed, %d excluded", p, f, x}' "$out/logs/$t.test.log")"
    line+=" ($(elapsed $((SECONDS - t0))))"
    grep -E '^test .* FAILED$' "$out/logs/$t.test.log" | sed 's/^/    /' >>"$out/logs/$t.test.failed" || true

    echo "$ok $line" >"$out/status/$t"
}

build_args=()
for t in "${targets[@]}"; do
    target_env "$t"
    build_args+=(--target "$t")
done
step "cross-building foldprint and its tests for ${targets[*]}"
t0=$SECONDS
build_ok=true
cargo test --locked --tests --no-run --no-fail-fast "${build_args[@]}" "${profile[@]}" \
    --message-format=json-render-diagnostics \
    >"$out/logs/build.json" 2>"$out/logs/build.log" || build_ok=false
build_time=$(elapsed $((SECONDS - t0)))
step "built in $build_time$($build_ok || echo ' (with errors)')"

pids=()
for t in "${targets[@]}"; do
    read -r arch endian _ _ _ _ <<<"${spec[$t]}"
    # Only what this cargo run built or found fresh counts: never a binary
    # left over from an earlier build.
    jq -r --arg dir "/target/$t/cross/" '
        select(.reason == "compiler-artifact" and .profile.test and .executable != null)
        | .executable | select(contains($dir))' "$out/logs/build.json" >"$out/logs/$t.tests"
    if jq -n -e --arg exe "/target/$t/cross/foldprint" '
        any(inputs; .reason == "compiler-artifact" and .executable != null
            and (.profile.test | not) and (.executable | endswith($exe)))' \
        "$out/logs/build.json" >/dev/null \
        && [ -s "$out/logs/$t.tests" ]; then
        check_target "$t" "$build_time for all targets" >"$out/logs/$t.check.log" 2>&1 &
        pids+=($!)
    else
        echo "false $t ($arch, $endian-endian): build FAILED (see $out/logs/build.log)" >"$out/status/$t"
    fi
done
$build_ok || tail -n 40 "$out/logs/build.log" >&2
for p in "${pids[@]}"; do
    wait "$p" || true
done

# --- the record: every architecture against the native report ---------------------
step "compare: ${#targets[@]} report(s) against $(basename "$reference")"
compare_ok=true
if ! FOLDPRINT=$foldprint ci/compare-reports.sh --reference "$reference" \
    --expect "${#targets[@]}" "$out/reports" >"$out/summary.md" 2>"$out/logs/compare.log"; then
    compare_ok=false
fi

echo
echo "Excluded under qemu-user (each runs natively in .ci/run):"
last_reason=""
for e in "${EXCLUDED[@]}"; do
    if [ "${e#*  }" != "$last_reason" ]; then
        last_reason=${e#*  }
        echo "  because it $last_reason:"
    fi
    echo "    ${e%%  *}"
done
echo
status=0
$native_ok || status=1
if ! $build_ok; then
    status=1
    echo "build: FAILED for at least one target (see $out/logs/build.log)"
fi
# What verify concluded: its last line on success, its problems otherwise.
verdict() { awk '/^verify ok: / {print} /^verify FAILED/ {f = 1} f && n < 6 {print; n++}' "$1"; }
echo "native $native: $(verdict "$out/logs/native.verify.log")"
for t in "${targets[@]}"; do
    if [ -s "$out/status/$t" ]; then
        read -r ok line <"$out/status/$t"
    else
        ok=false
        line="$t: no result (see $out/logs/$t.check.log)"
    fi
    echo "$line"
    if [ "$ok" != true ]; then
        status=1
        if [ -s "$out/logs/$t.test.failed" ]; then cat "$out/logs/$t.test.failed"; fi
        if [ -s "$out/logs/$t.verify.log" ]; then verdict "$out/logs/$t.verify.log" | sed 's/^/    /'; fi
    fi
done
if $compare_ok; then
    echo "compare: $(sed -n 's/^\*\*PASS\*\*: //p' "$out/summary.md")"
else
    status=1
    echo "compare: FAILED"
    sed 's/^/    /' "$out/summary.md" "$out/logs/compare.log" | awk "NR <= 40"
fi
# CPU time of everything this script ran (user + system), which unlike the
# wall time does not grow when other jobs share the machine.
times >"$out/logs/times.txt" # not in a subshell: it would count only its own children
cpu=$(awk 'NR == 2 {
    n = split($1 " " $2, t, " "); s = 0
    for (i = 1; i <= n; i++) { split(t[i], p, "m"); s += p[1] * 60 + p[2] }
    printf "%d", s }' "$out/logs/times.txt")
echo "cross-arch: $([ $status -eq 0 ] && echo ok || echo FAILED) in $(elapsed $((SECONDS - start_all))), $(elapsed "$cpu") of CPU time (record: $out/summary.md, $out/reports/)"
exit $status
