#!/usr/bin/env bash
# Make sure the dashboard's browser tests (tests/browser) have a Chromium to drive.
#
# Playwright's own `playwright install` downloads browser builds from a host this kind of
# machine cannot reach, so the tests launch Debian's Chromium (/usr/bin/chromium, or
# $TASKQ_TEST_CHROMIUM). As root with apt-get this installs it when missing; otherwise it
# says why it cannot and the browser tests skip with that reason (never fails the run).
set -u
chromium="${TASKQ_TEST_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$chromium" ]; then
    exit 0
fi
if [ "$chromium" != /usr/bin/chromium ]; then
    echo "ensure-browser: TASKQ_TEST_CHROMIUM=$chromium is not an executable;" \
        "the browser tests will skip" >&2
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "ensure-browser: no Chromium at $chromium and not root with apt-get;" \
        "the browser tests will skip (install it with: sudo apt-get install -y chromium)" >&2
    exit 0
fi
echo "ensure-browser: installing chromium with apt-get"
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; then
    echo "ensure-browser: apt-get install chromium failed; the browser tests will skip" >&2
fi
exit 0
