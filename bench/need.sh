# Sourced by the bench scripts: `need WHO TOOL:PACKAGE...` installs (Debian) the
# packages whose tool is missing, plus python3-websockets and php-fpm when absent;
# then stops the system services those packages may start (the benches start their
# own).
need() {
    local who=$1 missing=() tool
    shift
    for tool in "$@"; do
        command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] || missing+=("${tool#*:}")
    done
    /usr/bin/python3 -c 'import websockets' 2>/dev/null || missing+=(python3-websockets)
    ls /usr/sbin/php-fpm* >/dev/null 2>&1 || missing+=(php-fpm)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "$who: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    if command -v service >/dev/null; then
        local s
        for s in nginx haproxy redis-server; do service "$s" stop >/dev/null 2>&1 || true; done
        for s in /etc/init.d/php*-fpm; do [ -x "$s" ] && "$s" stop >/dev/null 2>&1 || true; done
    fi
}
