# Sourced by hack/install-*.sh: `apt_install PACKAGE...` installs Debian packages, one of our
# installers at a time. apt-get install can wait for dpkg's lock (DPkg::Lock::Timeout), but
# apt-get update fails at once on the lists lock another apt-get holds, and `make prepare` runs
# two installers side by side (hack/install-node-deps.sh beside the others): a flock orders them.
apt_install() {
  local name="${0##*/}"
  if [[ "$(id -u)" != 0 ]]; then
    echo "${name%.sh}: need root for apt-get install $*" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  local lock fd
  lock="${TMPDIR:-/tmp}/embedfleet-apt.lock"
  exec {fd}>"$lock"
  flock "$fd"
  local opts=(-o DPkg::Lock::Timeout=600 -qq)
  # The package lists a machine has usually serve: an update (tens of seconds) only if they fail.
  if ! apt-get "${opts[@]}" install -y --no-install-recommends "$@" >/dev/null 2>&1; then
    apt-get "${opts[@]}" update
    apt-get "${opts[@]}" install -y --no-install-recommends "$@" >/dev/null
  fi
  exec {fd}>&-
}
