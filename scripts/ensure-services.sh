#!/usr/bin/env bash
# Make sure local services answer on 127.0.0.1, starting or installing them when needed.
#
#   scripts/ensure-services.sh rabbitmq|postgres ...
#
# For each service: answering -> nothing to do; installed but down -> start it and wait;
# missing -> install it with apt-get when running as root, otherwise stop with one line
# naming the package to install. Safe to run again and again.
set -euo pipefail

# the server commands live in sbin, which a non-root PATH may lack
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

HOST=127.0.0.1
RABBITMQ_PORT=5672
POSTGRES_PORT=5432
RABBITMQ_WAIT_S=60
POSTGRES_WAIT_S=30
LOG_DIR="${TMPDIR:-/tmp}"

die() {
    echo "$*" >&2
    exit 1
}

have() {
    command -v "$1" >/dev/null 2>&1
}

is_root() {
    [ "$(id -u)" -eq 0 ]
}

# port -> success when something accepts a TCP connection on HOST:port
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

# seconds command... -> success as soon as the command succeeds, failure after the deadline
wait_until() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            return 1
        fi
        sleep 1
    done
}

# service package command -> installs the Debian package, or exits naming what to install
install_package() {
    local service=$1 package=$2 command=$3 log
    if ! is_root; then
        die "$service: not installed; install it with: sudo apt-get install $package"
    fi
    if ! have apt-get; then
        die "$service: not installed and no apt-get here; install the $package package"
    fi
    echo "$service: installing $package with apt-get"
    log="$LOG_DIR/ensure-services-apt.log"
    if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "$package"; } \
        >"$log" 2>&1 </dev/null; then
        # without an init system the package's own start may fail; we start it ourselves
        if ! have "$command"; then
            tail -n 20 "$log" >&2
            die "$service: apt-get install $package failed (full log: $log)"
        fi
    fi
}

# --- RabbitMQ ---------------------------------------------------------------------------

rabbitmq_up() {
    port_open "$RABBITMQ_PORT"
}

start_rabbitmq() {
    local log="$LOG_DIR/ensure-services-rabbitmq.log"
    # detached, with no handle on our output, so that a pipe reading make never waits on it
    if ! rabbitmq-server -detached >"$log" 2>&1 </dev/null; then
        is_root || die "rabbitmq: installed but not running; start it with: sudo rabbitmq-server -detached"
        die "rabbitmq: 'rabbitmq-server -detached' failed (see $log and /var/log/rabbitmq)"
    fi
    wait_until "$RABBITMQ_WAIT_S" rabbitmq_up ||
        die "rabbitmq: started but not answering on $HOST:$RABBITMQ_PORT after ${RABBITMQ_WAIT_S}s (see /var/log/rabbitmq)"
    if have rabbitmqctl; then
        timeout "$RABBITMQ_WAIT_S" rabbitmqctl await_startup >>"$log" 2>&1 </dev/null ||
            die "rabbitmq: 'rabbitmqctl await_startup' failed (see $log and /var/log/rabbitmq)"
    fi
}

ensure_rabbitmq() {
    if rabbitmq_up; then
        echo "rabbitmq: answering on $HOST:$RABBITMQ_PORT"
        return
    fi
    if ! have rabbitmq-server; then
        install_package rabbitmq rabbitmq-server rabbitmq-server
    fi
    # the package's own scripts may have started it already
    if ! rabbitmq_up; then
        start_rabbitmq
    fi
    echo "rabbitmq: started, answering on $HOST:$RABBITMQ_PORT"
}

# --- PostgreSQL -------------------------------------------------------------------------

postgres_up() {
    if have pg_isready; then
        pg_isready -q -h "$HOST" -p "$POSTGRES_PORT" -t 2
    else
        port_open "$POSTGRES_PORT"
    fi
}

# the newest installed major version, e.g. 15; empty when there is no cluster configuration
postgres_version() {
    if [ -d /etc/postgresql ]; then
        find /etc/postgresql -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -V | tail -n 1
    fi
}

start_postgres() {
    local version=$1 log="$LOG_DIR/ensure-services-postgres.log"
    if ! pg_ctlcluster --skip-systemctl-redirect "$version" main start >"$log" 2>&1 </dev/null; then
        # a cluster that came up meanwhile makes pg_ctlcluster fail with 'already running'
        postgres_up && return
        is_root || die "postgres: installed but not running; start it with: sudo pg_ctlcluster $version main start"
        die "postgres: 'pg_ctlcluster $version main start' failed (see $log)"
    fi
    wait_until "$POSTGRES_WAIT_S" postgres_up ||
        die "postgres: started but not answering on $HOST:$POSTGRES_PORT after ${POSTGRES_WAIT_S}s (see $log)"
}

# psql as the postgres superuser over the local socket (peer authentication)
as_postgres_psql() {
    (cd / && runuser -u postgres -- psql -X -q -w -v ON_ERROR_STOP=1 -d postgres "$@" </dev/null)
}

# what the test suite uses: postgresql://root@127.0.0.1:5432/test, no password
root_can_connect() {
    have psql || return 0 # nothing to check with; the test suite will say
    PGCONNECT_TIMEOUT=5 psql -X -w -h "$HOST" -p "$POSTGRES_PORT" -U root -d test -tAc 'SELECT 1' \
        </dev/null >/dev/null 2>&1
}

# a fresh Debian cluster knows no role root and wants passwords over TCP: trust root from
# 127.0.0.1 and create the role and the database test, as on the project's machines
configure_test_role() {
    local hba
    hba=$(as_postgres_psql -tA -c 'SHOW hba_file') || return 1
    if ! grep -qE '^host[[:space:]]+all[[:space:]]+root[[:space:]]+127\.0\.0\.1/32[[:space:]]+trust' "$hba"; then
        sed -i '1i host all root 127.0.0.1/32 trust' "$hba" || return 1
        as_postgres_psql -tA -c 'SELECT pg_reload_conf()' >/dev/null || return 1
    fi
    if [ -z "$(as_postgres_psql -tA -c "SELECT 1 FROM pg_roles WHERE rolname = 'root'")" ]; then
        as_postgres_psql -c 'CREATE ROLE root SUPERUSER LOGIN' || return 1
    fi
    if [ -z "$(as_postgres_psql -tA -c "SELECT 1 FROM pg_database WHERE datname = 'test'")" ]; then
        as_postgres_psql -c 'CREATE DATABASE test OWNER root' || return 1
    fi
    # pg_reload_conf() only signals the server: wait for the new rule to apply
    wait_until 10 root_can_connect
}

ensure_postgres() {
    local version state="answering"
    if ! postgres_up; then
        version=$(postgres_version)
        if ! have pg_ctlcluster || [ -z "$version" ]; then
            install_package postgres postgresql pg_ctlcluster
            version=$(postgres_version)
            [ -n "$version" ] || die "postgres: installed, but no cluster under /etc/postgresql"
        fi
        # the package's own scripts may have started it already
        if ! postgres_up; then
            start_postgres "$version"
        fi
        state="started, answering"
    fi
    if is_root && ! root_can_connect; then
        echo "postgres: setting up role root and database test for postgresql://root@$HOST:$POSTGRES_PORT/test"
        configure_test_role ||
            echo "postgres: could not set up role root and database test; tests that use PostgreSQL will fail" >&2
    fi
    echo "postgres: $state on $HOST:$POSTGRES_PORT"
}

# --- main -------------------------------------------------------------------------------

[ "$#" -gt 0 ] || die "usage: $0 rabbitmq|postgres ..."
for service in "$@"; do
    case "$service" in
        rabbitmq) ensure_rabbitmq ;;
        postgres | postgresql) ensure_postgres ;;
        *) die "unknown service: $service (known: rabbitmq, postgres)" ;;
    esac
done
