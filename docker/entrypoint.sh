#!/usr/bin/env bash
# dagtrain's entrypoint, in front of the Airflow image's own (/entrypoint).
#
# On the containers that run training ranks (DAGTRAIN_SSHD=true: the Celery workers of
# docker-compose.yaml) it first starts an OpenSSH server as the container's own user (no
# root, port DAGTRAIN_SSH_PORT), so that mpirun or horovodrun on one worker can start
# ranks on another. Every key is made here, at start-up, and none is in the image:
#
#   - this container's host key: new at every start, kept inside the container;
#   - the workers' user key pair: made once, by the first worker that starts, on the
#     volume the workers share (DAGTRAIN_SSH_DIR), with authorized_keys beside it;
#   - known_hosts, on the same volume: each worker replaces its own line with its new
#     host key as it starts, so a worker checks whom it talks to (StrictHostKeyChecking).
#
# ssh from this container to DAGTRAIN_SSH_HOSTS (default: any host) then uses that
# port, that key and that known_hosts (~/.ssh/config). Then Airflow's entrypoint runs,
# with the same arguments.
set -euo pipefail

: "${DAGTRAIN_SSHD:=false}"
: "${DAGTRAIN_SSH_DIR:=/opt/dagtrain/ssh}"
: "${DAGTRAIN_SSH_PORT:=2222}"
: "${DAGTRAIN_SSH_HOSTS:=*}"

log() { echo "dagtrain-entrypoint: $*" >&2; }

ensure_passwd_entry() {
    # sshd serves only an account it can look up, and runs commands in its shell. For a
    # uid without an entry (OpenShift-style arbitrary uid, group 0) add one as Airflow's
    # entrypoint would, with bash instead of nologin: /etc/passwd is group-0 writable.
    if whoami >/dev/null 2>&1; then
        return
    fi
    if [[ ! -w /etc/passwd ]]; then
        log "error: uid $(id -u) has no /etc/passwd entry and cannot add one; sshd needs it"
        exit 1
    fi
    local home="${AIRFLOW_USER_HOME_DIR:-/home/airflow}"
    echo "${USER_NAME:-default}:x:$(id -u):0:${USER_NAME:-default} user:${home}:/bin/bash" \
        >>/etc/passwd
    export HOME="${home}"
}

host_names() {
    # the names and addresses other workers may use for this one (mpirun --host)
    {
        hostname
        hostname -f 2>/dev/null || true
        hostname -I 2>/dev/null | tr ' ' '\n' || true
    } | sed '/^$/d' | sort -u
}

start_sshd() {
    local shared="${DAGTRAIN_SSH_DIR}" own="${HOME}/.ssh/dagtrain" me
    me="$(hostname)"
    local umask_before
    umask_before="$(umask)"
    umask 077
    if [[ ! -d "${shared}" || ! -w "${shared}" ]]; then
        log "error: ${shared} is not a writable directory: mount the volume the workers" \
            "share there (docker-compose.yaml: dagtrain-ssh), or set DAGTRAIN_SSHD=false"
        exit 1
    fi
    mkdir -p "${own}"
    chmod 700 "${HOME}/.ssh" "${own}"

    # this container's host key: new at every start, never shared, never in the image
    rm -f "${own}/ssh_host_ed25519_key" "${own}/ssh_host_ed25519_key.pub"
    ssh-keygen -q -t ed25519 -N '' -C "${me}" -f "${own}/ssh_host_ed25519_key"

    local names
    names="$(host_names | sed "s/.*/[&]:${DAGTRAIN_SSH_PORT}/" | paste -sd, -)"
    (
        flock 9  # two workers starting at once: one makes the key pair, both update lines
        if [[ ! -s "${shared}/id_ed25519" || ! -s "${shared}/id_ed25519.pub" ]]; then
            rm -f "${shared}/id_ed25519" "${shared}/id_ed25519.pub"
            ssh-keygen -q -t ed25519 -N '' -C "dagtrain-workers" -f "${shared}/id_ed25519"
            log "made the workers' ssh key pair in ${shared}"
        fi
        # the key may only run commands: no forwarding, no pty
        echo "restrict $(cat "${shared}/id_ed25519.pub")" >"${shared}/authorized_keys.new"
        mv "${shared}/authorized_keys.new" "${shared}/authorized_keys"
        # known_hosts: every other worker's line as it is, this one's with its new key
        # (the key's comment, the last field, names the worker)
        touch "${shared}/known_hosts"
        awk -v me="${me}" '$NF != me' "${shared}/known_hosts" >"${shared}/known_hosts.new"
        echo "${names} $(cat "${own}/ssh_host_ed25519_key.pub")" >>"${shared}/known_hosts.new"
        mv "${shared}/known_hosts.new" "${shared}/known_hosts"
    ) 9>"${shared}/.lock"
    chmod 600 "${shared}/id_ed25519"
    chmod 644 "${shared}/id_ed25519.pub" "${shared}/authorized_keys" "${shared}/known_hosts"

    cat >"${HOME}/.ssh/config" <<EOF
# written by dagtrain's entrypoint at start-up: how this container reaches the workers
Host ${DAGTRAIN_SSH_HOSTS}
    Port ${DAGTRAIN_SSH_PORT}
    IdentityFile ${shared}/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile ${shared}/known_hosts
    StrictHostKeyChecking yes
    BatchMode yes
    LogLevel ERROR
EOF
    chmod 600 "${HOME}/.ssh/config"

    cat >"${own}/sshd_config" <<EOF
# written by dagtrain's entrypoint at start-up: an sshd run by the account it serves
Port ${DAGTRAIN_SSH_PORT}
HostKey ${own}/ssh_host_ed25519_key
PidFile ${own}/sshd.pid
AuthorizedKeysFile ${shared}/authorized_keys
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
# the image's home is group-writable by design (any uid in group 0 runs it), which
# StrictModes refuses; the key files are this script's, made with umask 077
StrictModes no
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
PrintMotd no
# a rank's command (mpirun's prted, python) finds the image's Python and Open MPI first
SetEnv PATH=${PATH}
EOF
    /usr/sbin/sshd -t -f "${own}/sshd_config"
    /usr/sbin/sshd -f "${own}/sshd_config" -E "${own}/sshd.log"
    umask "${umask_before}"
    log "sshd listening on port ${DAGTRAIN_SSH_PORT} as $(whoami); keys in ${shared}" \
        "(log: ${own}/sshd.log)"
}

if [[ "${DAGTRAIN_SSHD}" == "true" ]]; then
    ensure_passwd_entry
    start_sshd
fi

exec /entrypoint "$@"
