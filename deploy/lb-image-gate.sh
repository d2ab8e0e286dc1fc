#!/bin/bash
# lb-image-gate: the guard of lb image rollouts (docs/openshift.md, Day 2, "A new image").
#
# `lbctl render --image` ships this script as /usr/local/bin/lb-image-gate and the oneshot unit
# lb-image-gate.service that runs it; the NodeDisruptionPolicy it renders makes the
# machine-config daemon restart that unit after it wrote lb's static pod. The unit succeeds once
# an lbd started after the manifest was written answers ready on its socket (the kubelet replaced
# the pod and the new image runs), and fails after the timeout. A failed restart action fails
# the node's update: the daemon reports the node degraded and the pool's rollout stops there,
# so a broken image takes lbd off one node, whose VIPs the others hold, never off the next.
#
# Needs curl and jq (both on RHCOS). The environment overrides the paths and the timeout (the
# labs run this script as shipped, against a pod's files).
set -u
manifest=${LB_GATE_MANIFEST:-/etc/kubernetes/manifests/lb.yaml}
socket=${LB_GATE_SOCKET:-/run/lbd/lbd.sock}
timeout=${LB_GATE_TIMEOUT_S:-300}
interval=${LB_GATE_INTERVAL_S:-2}

if [ ! -e "$manifest" ]; then
    echo "lb-image-gate: $manifest is gone (lb removed): nothing to wait for"
    exit 0
fi
written=$(stat -c %Y "$manifest")
deadline=$(($(date +%s) + timeout))
last="no answer on $socket"
while [ "$(date +%s)" -lt "$deadline" ]; do
    if stats=$(curl -sf --max-time 2 --unix-socket "$socket" http://lbd/v1/stats); then
        ready=$(jq -r .ready <<<"$stats")
        up=$(jq -r .uptime_s <<<"$stats")
        started=$(($(date +%s) - up))
        # An lbd older than the manifest is the pod the kubelet has not replaced yet.
        if [ "$started" -lt "$written" ]; then
            last="lbd answers but started before $manifest was written (${up}s ago)"
        elif [ "$ready" != true ]; then
            last="the new lbd answers but is not ready"
        else
            echo "lb-image-gate: lbd ready, started ${up}s ago, after $manifest was written"
            exit 0
        fi
    fi
    sleep "$interval"
done
echo "lb-image-gate: no ready lbd started after $manifest was written within ${timeout}s: $last" >&2
exit 1
