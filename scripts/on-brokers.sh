#!/usr/bin/env bash
# Run the test suite once per RabbitMQ broker: what `make test` (and so CI) does.
#
#   scripts/on-brokers.sh                 # BROKERS="3.10 4.3" (the default)
#   BROKERS=4.3 scripts/on-brokers.sh     # one broker only
#
# Brokers:
#   3.10  the machine's RabbitMQ (Debian 12: 3.10.8) on 127.0.0.1:5672 (make services)
#   4.3   the private RabbitMQ 4.3 node r43@localhost on 127.0.0.1:5673, root /opt/rmq43
#         (make rabbitmq4: scripts/ensure-rabbitmq4.sh)
#
# Layers: the default layer always; the slow layer, the fault suite and the cluster suite when
# TASKQ_SLOW=1, TASKQ_FAULTS=1, TASKQ_CLUSTER=1 ask for them (.ci/run sets all three). Each
# layer is a pytest run of its own, chosen by markers so that every test belongs to exactly
# one: default = no slow, faults or cluster marker; slow = slow, not faults or cluster;
# fault = faults; cluster = cluster, not faults.
# RabbitMQ 4.3 runs every layer asked for. RabbitMQ 3.10 runs the default and slow layers
# only: the fault and cluster suites start private nodes of their own and kill them, and
# running them twice would take CI past its hour (times and reasons: docs/rabbitmq.md, "How
# taskq is tested"). ON_310_LAYERS overrides that choice ("default slow fault cluster" runs
# everything on 3.10 too).
#
# Each run begins with a line saying which broker (its version, read from the broker) and
# which layer, and ends with a line saying how it went and how long it took; the Django 6.1
# tests (.venv-django6) follow the layers of each broker, against the same broker. Every run
# goes ahead even when an earlier one failed, so one `make test` shows every failure; the
# exit status is non-zero when any failed (or a broker could not be reached), and the last
# lines list them all with their times.
#
# Settings (environment): BROKERS, ON_310_LAYERS, PYTEST_ARGS (added to every layer's run;
# a -m of its own would replace the layer's), VENV (.venv), DJANGO6_VENV (.venv-django6;
# empty: no Django 6.1 runs), DJANGO_TESTS, RMQ4_ROOT (/opt/rmq43), RMQ4_PORT (5673).
set -uo pipefail
cd "$(dirname "$0")/.."

BROKERS=${BROKERS:-3.10 4.3}
ON_310_LAYERS=${ON_310_LAYERS:-default slow}
VENV=${VENV:-.venv}
DJANGO6_VENV=${DJANGO6_VENV-.venv-django6}
DJANGO_TESTS=${DJANGO_TESTS:-tests/contrib/test_django.py tests/contrib/test_django_tasks.py}
PYTEST_ARGS=${PYTEST_ARGS:-}
RMQ4_ROOT=${RMQ4_ROOT:-/opt/rmq43}
RMQ4_PORT=${RMQ4_PORT:-5673}

# Tests of the 4.x node itself (tests/support/rabbitmq4.py) use the same node.
export TASKQ_TEST_RABBITMQ4_URL=${TASKQ_TEST_RABBITMQ4_URL:-amqp://guest:guest@127.0.0.1:$RMQ4_PORT/%2F}

# The layers asked for, by the variables conftest.py reads.
asked=(default)
[ "${TASKQ_SLOW:-}" = 1 ] && asked+=(slow)
[ "${TASKQ_FAULTS:-}" = 1 ] && asked+=(fault)
[ "${TASKQ_CLUSTER:-}" = 1 ] && asked+=(cluster)

results=()
failed=0

broker_url() {
    case "$1" in
        3.10) echo "amqp://guest:guest@127.0.0.1:5672/%2F" ;;
        4.3) echo "amqp://guest:guest@127.0.0.1:$RMQ4_PORT/%2F" ;;
        *) return 1 ;;
    esac
}

# url -> the broker's version (its server properties), or nothing when it does not answer
broker_version() {
    "$VENV/bin/python" - "$1" 2>/dev/null <<'EOF'
import sys
import pika
connection = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
version = (connection._impl.server_properties or {}).get("version", b"?")
connection.close()
print(version.decode() if isinstance(version, bytes) else version)
EOF
}

# broker -> the layers to run on it, space-separated
layers_on() {
    local layer wanted=" ${asked[*]} "
    if [ "$1" = 3.10 ]; then
        wanted=""
        for layer in "${asked[@]}"; do
            case " $ON_310_LAYERS " in *" $layer "*) wanted+=" $layer" ;; esac
        done
    fi
    echo $wanted
}

# seconds -> "9m 12s"
duration() {
    printf '%dm %02ds' $(($1 / 60)) $(($1 % 60))
}

# title command... -> run it, print its outcome and time, remember them
run_pass() {
    local title=$1 started=$SECONDS status
    shift
    echo
    echo "=== $title ==="
    "$@"
    status=$?
    local took
    took=$(duration $((SECONDS - started)))
    if [ "$status" -eq 0 ]; then
        echo "=== $title: passed in $took ==="
        results+=("passed  $took  $title")
    elif [ "$status" -eq 5 ]; then
        # pytest's "no tests collected": PYTEST_ARGS chose none of this layer's tests
        echo "=== $title: no tests of this layer selected ($took) ==="
        results+=("none    $took  $title")
    else
        echo "=== $title: FAILED (pytest exit $status) in $took ==="
        results+=("FAILED  $took  $title (pytest exit $status)")
        failed=1
    fi
}

# layer -> its marker expression
layer_markers() {
    case "$1" in
        default) echo "not slow and not faults and not cluster" ;;
        slow) echo "slow and not faults and not cluster" ;;
        fault) echo "faults" ;;
        cluster) echo "cluster and not faults" ;;
    esac
}

for broker in $BROKERS; do
    if ! url=$(broker_url "$broker"); then
        echo "on-brokers: unknown broker '$broker' in BROKERS (known: 3.10 4.3)" >&2
        results+=("FAILED  -  unknown broker $broker")
        failed=1
        continue
    fi
    where=${url#*@}
    where=${where%%/*}
    version=$(broker_version "$url")
    case "$version" in
        "$broker".*) ;;
        "")
            echo "on-brokers: no RabbitMQ answers at $where for the $broker pass" \
                "(make services / make rabbitmq4)" >&2
            results+=("FAILED  -  RabbitMQ $broker at $where: no broker answers")
            failed=1
            continue
            ;;
        *)
            echo "on-brokers: the broker at $where runs RabbitMQ $version, not $broker" >&2
            results+=("FAILED  -  RabbitMQ $broker at $where: runs $version")
            failed=1
            continue
            ;;
    esac
    # every layer's run sees the switches of all layers asked for (a test may carry several
    # markers); the marker expression picks the layer
    pass_env=(-u TASKQ_SLOW -u TASKQ_FAULTS -u TASKQ_CLUSTER -u TASKQ_TEST_RABBITMQ_ROOT
        TASKQ_TEST_BROKER_URL="$url")
    for layer in "${asked[@]}"; do
        case "$layer" in
            slow) pass_env+=(TASKQ_SLOW=1) ;;
            fault) pass_env+=(TASKQ_FAULTS=1) ;;
            cluster) pass_env+=(TASKQ_CLUSTER=1) ;;
        esac
    done
    if [ "$broker" = 4.3 ]; then
        # the fault and cluster suites start their private nodes from this root
        pass_env+=(TASKQ_TEST_RABBITMQ_ROOT="$RMQ4_ROOT")
    fi
    only_once=()
    if [ "$broker" = 4.3 ] && [[ " $BROKERS " == *" 3.10 "* ]]; then
        # The 3.10 -> 4.3 upgrade test uses both brokers whatever the run's broker is, and
        # its old node must be 3.10: it runs once, in the 3.10 run.
        only_once=(--deselect tests/system/test_upgrade_to_rabbitmq4.py)
    fi
    for layer in $(layers_on "$broker"); do
        # shellcheck disable=SC2086
        run_pass "RabbitMQ $version at $where: $layer layer" \
            env "${pass_env[@]}" "$VENV/bin/pytest" -q -m "$(layer_markers "$layer")" \
            "${only_once[@]}" $PYTEST_ARGS
    done
    if [ -n "$DJANGO6_VENV" ]; then
        # shellcheck disable=SC2086
        run_pass "RabbitMQ $version at $where: Django 6.1 tests ($DJANGO6_VENV)" \
            env "${pass_env[@]}" "$DJANGO6_VENV/bin/pytest" -q $DJANGO_TESTS
    fi
done

echo
echo "=== summary (BROKERS=\"$BROKERS\") ==="
for line in "${results[@]}"; do
    echo "$line"
done
exit "$failed"
