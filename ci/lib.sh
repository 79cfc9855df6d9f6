# shellcheck shell=bash
# Shared by the ci/*.sh scripts: `source` it after setting ci_name (the
# name a script's messages start with).

# Run a command as root: directly when we are root, else through sudo
# without a password prompt; say what could not be run otherwise.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        echo "${ci_name:-ci}: need root or sudo to run: $*" >&2
        return 1
    fi
}
