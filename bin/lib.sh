# Shared by bin/up and bin/test (sourced, not run). Everything here is
# idempotent and non-interactive, because CI runs it on a machine in any state
# with no standard input.

# The repository root, whatever directory the caller started in.
CREWLET_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$CREWLET_ROOT/.venv"

log() { printf 'crewlet: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Run a command as root (we are root on these machines; sudo -n elsewhere, never a prompt).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
  else die "need root for: $*"
  fi
}

# Run a command as the postgres OS user (peer authentication over the socket).
as_postgres() {
  if [ "$(id -u)" -eq 0 ]; then
    if command -v runuser >/dev/null 2>&1; then runuser -u postgres -- "$@"; else su postgres -s /bin/sh -c "$(printf '%q ' "$@")"; fi
  else sudo -n -u postgres "$@"
  fi
}

apt_install() {
  log "installing $* with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh machine may be running apt at boot (or a second bin/test may be): wait for its lock, don't fail.
  as_root apt-get -o DPkg::Lock::Timeout=600 update -q
  as_root apt-get -o DPkg::Lock::Timeout=600 install -y -q ${APT_RECOMMENDS:---no-install-recommends} "$@"
}

# A Python >= 3.11 to build .venv from.
find_python() {
  local candidate
  for candidate in "${CREWLET_PYTHON:-}" python3.11 python3 python; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

# Create or refresh .venv. `ensure_venv` installs requirements.txt (what the
# service runs on); `ensure_venv dev` installs requirements-dev.txt, which adds
# the test and development tools on top. Fast when nothing changed: the hash of
# the file(s) (plus the interpreter version) is stored in .venv, one stamp per
# kind, and pip only runs when it differs.
ensure_venv() {
  local kind="${1:-runtime}" file stamp want have="" python
  case "$kind" in
    runtime) file="$CREWLET_ROOT/requirements.txt"; stamp="$VENV/.crewlet-requirements.sha256" ;;
    dev) file="$CREWLET_ROOT/requirements-dev.txt"; stamp="$VENV/.crewlet-requirements-dev.sha256" ;;
    *) die "ensure_venv: unknown kind '$kind' (runtime or dev)" ;;
  esac
  mkdir -p "$CREWLET_ROOT/var"
  exec 9>"$CREWLET_ROOT/var/.venv.lock"
  flock 9 2>/dev/null || true   # two commands starting at once must not both pip install

  if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    log ".venv is broken (its interpreter is gone); recreating it"
    rm -rf "$VENV"
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    python="$(find_python)" || die "Python 3.11 or newer not found (set CREWLET_PYTHON=/path/to/python3.11)"
    log "creating .venv with $python"
    if ! "$python" -m venv "$VENV" >/dev/null 2>&1; then
      rm -rf "$VENV"
      apt_install python3-venv
      "$python" -m venv "$VENV" || die "could not create $VENV"
    fi
  fi

  want="$( { cat "$CREWLET_ROOT/requirements.txt" "$file" | sha256sum | cut -d' ' -f1; "$VENV/bin/python" -VV; } | sha256sum | cut -d' ' -f1)"
  [ -f "$stamp" ] && have="$(cat "$stamp")"
  if [ "$want" != "$have" ]; then
    log "installing $(basename "$file") into .venv ($(grep -c '==' "$file") pinned packages; the first time takes a minute or two)"
    # pip names each package as it fetches it and once more when it installs them;
    # its download bars and notices are left out.
    if ! PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
      "$VENV/bin/python" -m pip install --progress-bar off -r "$file" 2>&1 \
      | { grep --line-buffered -E '^(Collecting|Installing collected|Successfully installed|ERROR)' || true; } \
      | sed -u 's/^/  pip: /' >&2; then
      die "pip could not install $(basename "$file") (its errors are above)"
    fi
    printf '%s\n' "$want" >"$stamp"
    log "installed $(basename "$file")"
  fi
  exec 9>&-
}

# Make a PostgreSQL server reachable over /var/run/postgresql for the current
# OS user: install it if absent, create a cluster if none exists, start it if
# down, create the role if missing. Exports CREWLET_PG_PORT/CREWLET_PG_USER.
ensure_postgres() {
  local ver cluster port status user
  command -v pg_lsclusters >/dev/null 2>&1 || apt_install postgresql

  # Prefer a cluster that is already online, else the newest installed one.
  read -r ver cluster port status _ < <(
    pg_lsclusters --no-header 2>/dev/null | sort -k4,4r -k1,1Vr | head -n 1
  ) || true
  if [ -z "${ver:-}" ]; then
    ver="$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1)"
    [ -n "$ver" ] || die "PostgreSQL is installed but no server version was found in /usr/lib/postgresql"
    log "creating PostgreSQL cluster $ver main"
    as_root pg_createcluster "$ver" main >/dev/null
    read -r ver cluster port status _ < <(pg_lsclusters --no-header | awk -v v="$ver" '$1 == v && $2 == "main"')
  fi
  if [ "$status" != "online" ]; then
    log "starting PostgreSQL cluster $ver $cluster"
    as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" start
  fi

  local deadline=$((SECONDS + 30))
  until pg_isready -q -h /var/run/postgresql -p "$port"; do
    [ "$SECONDS" -lt "$deadline" ] || die "PostgreSQL $ver $cluster did not accept connections within 30 s (see /var/log/postgresql/)"
    sleep 0.2
  done

  user="$(id -un)"
  if [ "$user" != postgres ] && [ "$(as_postgres psql -X -w -q -p "$port" -d postgres -tAc \
      "select 1 from pg_roles where rolname = '$user'")" != 1 ]; then
    log "creating PostgreSQL role $user"
    as_postgres psql -X -w -q -p "$port" -d postgres -c "create role \"$user\" superuser login" >/dev/null
  fi
  export CREWLET_PG_HOST=/var/run/postgresql CREWLET_PG_PORT="$port" CREWLET_PG_USER="$user"
}

# Debian's Chromium for the dashboard's browser tests (Playwright drives it with
# executable_path; it never downloads a browser of its own).
CREWLET_CHROMIUM="${CREWLET_CHROMIUM:-/usr/bin/chromium}"
ensure_chromium() {
  [ -x "$CREWLET_CHROMIUM" ] && return 0
  # With its recommended packages (fonts, Mesa's GL drivers): the set the browser tests were proven on.
  APT_RECOMMENDS=--install-recommends apt_install chromium fonts-liberation
  [ -x "$CREWLET_CHROMIUM" ] || die "chromium was installed but $CREWLET_CHROMIUM is missing"
}

# Debian's bubblewrap: the sandbox a coding run's job runs in (seats/sandbox/jail.py). Quick when it is
# there already. bin/test needs it; bin/up runs it in a subshell and starts without it when it cannot be
# installed (no root, no apt), a node that then refuses coding runs with the reason.
ensure_bwrap() {
  command -v bwrap >/dev/null 2>&1 && return 0
  apt_install bubblewrap
  command -v bwrap >/dev/null 2>&1 || die "bubblewrap was installed but bwrap is not on PATH"
}
