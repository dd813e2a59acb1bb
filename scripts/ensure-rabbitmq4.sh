#!/usr/bin/env bash
# Make sure a private RabbitMQ 4.3 node answers on 127.0.0.1:5673, beside the machine's 3.10.
#
#   scripts/ensure-rabbitmq4.sh          # build the root when missing, start the node
#   scripts/ensure-rabbitmq4.sh --stop   # stop the node and its epmd (the root stays)
#
# RabbitMQ 4.3 comes from Debian's own packages: Debian unstable (sid) carries 4.3.6 with the
# Erlang it needs, which wants a newer C library than this machine's, so it lives in a root of
# its own (debootstrap, about 45 s and 400 MB, made once and reused while it is there). The
# node has its own name, ports, epmd port and data directory, so it never meets the shared
# broker (5672) or its epmd (4369). Tests never stop or reconfigure it: each works in a vhost
# of its own (tests/support/rabbitmq4.py). When the node cannot be had this prints one line
# saying why and exits non-zero: never a silent skip.
#
# The node runs the Prometheus and consistent-hash plugins, not the management plugin, and with
# the management agent's metrics collector off: that collector is RabbitMQ 4.x's deprecated
# feature `management_metrics_collection` (it logs "Deprecated features" for it, which the
# tests' deprecated-feature check would count), and a management listener on 15672 would
# answer the management requests that tests aimed at the 3.10 broker (5672) derive from their
# host. The configuration is (re)written before every start, so an older root gets it too.
#
# Settings (environment): RMQ4_ROOT (/opt/rmq43), RMQ4_SUITE (sid), RMQ4_NODE
# (r43@localhost), RMQ4_PORT (5673), RMQ4_DIST_PORT (25673), RMQ4_EPMD_PORT (4373),
# RMQ4_PROMETHEUS_PORT (15692), RMQ4_MIRROR (the machine's Debian mirror). Everything
# listens on 127.0.0.1 only (AMQP, distribution, epmd, Prometheus).
set -euo pipefail
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

ROOT=${RMQ4_ROOT:-/opt/rmq43}
SUITE=${RMQ4_SUITE:-sid}
NODE=${RMQ4_NODE:-r43@localhost}
PORT=${RMQ4_PORT:-5673}
DIST_PORT=${RMQ4_DIST_PORT:-25673}
EPMD_PORT=${RMQ4_EPMD_PORT:-4373}
PROMETHEUS_PORT=${RMQ4_PROMETHEUS_PORT:-15692}
WAIT_S=90
LOG_DIR="${TMPDIR:-/tmp}"

die() {
    echo "rabbitmq4: $*" >&2
    exit 1
}

have() {
    command -v "$1" >/dev/null 2>&1
}

port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

in_root() {
    chroot "$ROOT" env HOME=/var/lib/rabbitmq ERL_EPMD_PORT="$EPMD_PORT" ERL_EPMD_ADDRESS=127.0.0.1 "$@"
}

ctl() {
    in_root rabbitmqctl -n "$NODE" "$@"
}

mirror() {
    if [ -n "${RMQ4_MIRROR:-}" ]; then
        echo "$RMQ4_MIRROR"
        return
    fi
    # the first http(s) URI of the machine's apt sources (deb822 or one-line form)
    local uri
    uri=$(grep -hoE '^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)https?://[^[:space:]]+' \
        /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
        | grep -v security | head -n 1 | grep -oE 'https?://[^[:space:]]+' || true)
    echo "${uri:-http://deb.debian.org/debian}"
}

root_ready() {
    [ -x "$ROOT/usr/sbin/rabbitmq-server" ] && [ -f "$ROOT/.taskq-rabbitmq4-ready" ]
}

build_root() {
    [ "$(id -u)" -eq 0 ] || die "no RabbitMQ 4.3 root at $ROOT and not root: building one needs root (debootstrap, chroot)"
    if ! have debootstrap; then
        have apt-get || die "debootstrap is missing and there is no apt-get to install it"
        echo "rabbitmq4: installing debootstrap with apt-get"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } \
            >"$LOG_DIR/ensure-rabbitmq4-apt.log" 2>&1 </dev/null \
            || die "apt-get install debootstrap failed (log: $LOG_DIR/ensure-rabbitmq4-apt.log)"
    fi
    local log="$LOG_DIR/ensure-rabbitmq4-debootstrap.log" source
    source=$(mirror)
    echo "rabbitmq4: building a Debian $SUITE root with rabbitmq-server at $ROOT from $source (about a minute)"
    umount "$ROOT/proc" 2>/dev/null || true
    rm -rf "$ROOT"
    mkdir -p "$ROOT"
    if ! debootstrap --variant=minbase --include=rabbitmq-server "$SUITE" "$ROOT" "$source" \
        >"$log" 2>&1 </dev/null; then
        tail -n 5 "$log" >&2
        die "debootstrap of Debian $SUITE with rabbitmq-server failed (log: $log)"
    fi
    echo "127.0.0.1 localhost" >"$ROOT/etc/hosts"
    touch "$ROOT/.taskq-rabbitmq4-ready"
}

PLUGINS="[rabbitmq_prometheus,rabbitmq_consistent_hash_exchange]."

# The node's plugins and configuration (header): written before each start, read at boot.
configure() {
    echo "$PLUGINS" >"$ROOT/etc/rabbitmq/enabled_plugins"
    cat >"$ROOT/etc/rabbitmq/rabbitmq.conf" <<EOF
# written by taskq's scripts/ensure-rabbitmq4.sh
management_agent.disable_metrics_collector = true
prometheus.tcp.ip = 127.0.0.1
prometheus.tcp.port = $PROMETHEUS_PORT
EOF
}

mount_proc() {
    if ! mountpoint -q "$ROOT/proc"; then
        mount -t proc proc "$ROOT/proc" || die "cannot mount /proc in $ROOT (Erlang needs it)"
    fi
}

node_answers() {
    port_open "$PORT" && ctl status >/dev/null 2>&1
}

start_node() {
    local log="$LOG_DIR/ensure-rabbitmq4-start.log"
    echo "rabbitmq4: starting $NODE on 127.0.0.1:$PORT (epmd $EPMD_PORT)"
    # detached, with no handle on our output, so that a pipe reading make never waits on it
    in_root env RABBITMQ_NODENAME="$NODE" RABBITMQ_NODE_PORT="$PORT" \
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_DIST_PORT="$DIST_PORT" \
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
        rabbitmq-server -detached >"$log" 2>&1 </dev/null || true
    local deadline=$((SECONDS + WAIT_S))
    until port_open "$PORT" && ctl await_startup >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 5 "$log" >&2 || true
            die "$NODE did not answer on 127.0.0.1:$PORT within ${WAIT_S}s (logs: $ROOT/var/log/rabbitmq/, $log)"
        fi
        sleep 1
    done
}

stop_node() {
    if [ -d "$ROOT" ] && mountpoint -q "$ROOT/proc"; then
        ctl stop >/dev/null 2>&1 || true
        in_root epmd -port "$EPMD_PORT" -kill >/dev/null 2>&1 || true
    fi
    echo "rabbitmq4: $NODE stopped"
}

if [ "${1:-}" = "--stop" ]; then
    stop_node
    exit 0
fi

if port_open "$PORT"; then
    if [ -d "$ROOT" ] && node_answers; then
        echo "rabbitmq4: $NODE answers on 127.0.0.1:$PORT"
        if [ "$(cat "$ROOT/etc/rabbitmq/enabled_plugins" 2>/dev/null)" != "$PLUGINS" ]; then
            # started by an older version of this script: never restarted behind a user's back
            echo "rabbitmq4: $NODE was started with an older configuration (management plugin);" \
                "restart it: bash $0 --stop && bash $0" >&2
        fi
        exit 0
    fi
    die "something else listens on 127.0.0.1:$PORT (not $NODE of $ROOT); set RMQ4_PORT or stop it"
fi
root_ready || build_root
configure
mount_proc
start_node
version=$(ctl version 2>/dev/null || echo "?")
case "$version" in
    4.*) echo "rabbitmq4: $NODE runs RabbitMQ $version on 127.0.0.1:$PORT" ;;
    *) die "the node in $ROOT runs RabbitMQ '$version', not 4.x" ;;
esac
