# shellcheck shell=bash
# scripts/stack.d/common.sh, sourced by scripts/stack: logging, Debian packages, a port probe.
# Expects ROOT, STATE and CACHE (set by scripts/stack).

log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# packages

APT_UPDATED=
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get to install them"
  [ "$(id -u)" -eq 0 ] || die "missing packages ${missing[*]}: run as root or install them"
  if [ -z "$APT_UPDATED" ]; then
    log "apt-get update"
    apt-get update -qq >/dev/null
    APT_UPDATED=yes
  fi
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Everything the Rust build needs (librdkafka is built by the rdkafka crate with cmake), the
# PostgreSQL server itself, and a font for the text of scripts/bench's plot (and its test).
install_packages() {
  apt_install postgresql postgresql-client cmake pkg-config build-essential \
    libcurl4-openssl-dev libsasl2-dev libssl-dev openssl zlib1g-dev fonts-dejavu-core
}

# port_open PORT [HOST]: something accepts connections on HOST (default 127.0.0.1):PORT
port_open() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }
