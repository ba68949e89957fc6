#!/usr/bin/env python3
"""Read one Ray cluster's node idleness and pending resource demand.

Usage: ray_probe.py --address HEAD_IP:GCS_PORT [--timeout SECONDS]

Prints exactly one JSON line on stdout and exits 0, or prints one JSON line
{"error": "..."} and exits 1. Uses only the standard library and ray; needs no
dashboard and does not join the cluster as a driver. It asks the GCS for the
same snapshot Ray's own autoscaler (v2) works from
(GcsClient.get_cluster_resource_state), plus the node table for head flags.

Output:
  nodes[]:          node_id (hex), ip, alive, is_head, status (RUNNING | IDLE |
                    DRAINING | DEAD), idle_s (seconds idle when status is IDLE,
                    0.0 when busy, null when dead), resources_total,
                    resources_used, activity (Ray's reasons a RUNNING node is busy;
                    empty otherwise, as Ray keeps stale reasons on idle nodes)
  pending[]:        one resource shape per task/actor that is waiting for
                    resources (infeasible ones included), at most --max-pending
                    entries; pending_by_shape has the same demand grouped by shape
  pending_gangs[]:  placement groups waiting: a list of bundles each
  constraints[]:    bundles asked for with ray.autoscaler.sdk.request_resources
  pending_count:    task/actor shapes waiting plus bundles of waiting
                    placement groups
  import_s, rpc_s:  seconds spent importing ray / talking to the GCS
"""

import argparse
import json
import sys
import time


def _bundle(msg_map):
    return {k: float(v) for k, v in sorted(msg_map.items())}


def _used(total, avail):
    return {k: round(v - avail.get(k, 0.0), 6) for k, v in total.items()}


def probe(address, timeout, max_pending):
    t0 = time.monotonic()
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    t1 = time.monotonic()
    gcs = GcsClient(address=address)

    raw = gcs.get_cluster_resource_state(timeout_s=timeout)
    reply = autoscaler_pb2.GetClusterResourceStateReply()
    reply.ParseFromString(raw)
    state = reply.cluster_resource_state

    heads = set()
    try:
        for node_id, info in gcs.get_all_node_info(timeout=timeout).items():
            if info.is_head_node:
                heads.add(info.node_id.hex())
    except Exception:  # head flag is a nicety; the rest still stands
        pass

    status_name = {v: k for k, v in autoscaler_pb2.NodeStatus.items()}
    nodes = []
    for n in state.node_states:
        node_id = n.node_id.hex()
        status = status_name.get(n.status, str(n.status))
        total = _bundle(n.total_resources)
        avail = _bundle(n.available_resources)
        alive = status != "DEAD"
        if not alive:
            idle_s = None
        elif status == "IDLE":
            idle_s = n.idle_duration_ms / 1000.0
        else:
            idle_s = 0.0
        nodes.append(
            {
                "node_id": node_id,
                "ip": n.node_ip_address,
                "alive": alive,
                "is_head": node_id in heads,
                "status": status,
                "idle_s": idle_s,
                "resources_total": total,
                "resources_used": _used(total, avail) if alive else {},
                "activity": list(n.node_activity) if status == "RUNNING" else [],
            }
        )

    pending, by_shape, count = [], [], 0
    for r in state.pending_resource_requests:
        shape = _bundle(r.request.resources_bundle)
        by_shape.append({"shape": shape, "count": int(r.count)})
        count += int(r.count)
        for _ in range(int(r.count)):
            if len(pending) >= max_pending:
                break
            pending.append(shape)

    gangs = []
    for g in state.pending_gang_resource_requests:
        bundles = [_bundle(req.resources_bundle) for req in g.requests]
        gangs.append({"details": g.details, "bundles": bundles})
        count += len(bundles)

    constraints = []
    for c in state.cluster_resource_constraints:
        for r in c.resource_requests:
            constraints.append(
                {"shape": _bundle(r.request.resources_bundle), "count": int(r.count)}
            )

    return {
        "session": state.cluster_session_name,
        "nodes": nodes,
        "pending": pending,
        "pending_by_shape": by_shape,
        "pending_gangs": gangs,
        "constraints": constraints,
        "pending_count": count,
        "import_s": round(t1 - t0, 4),
        "rpc_s": round(time.monotonic() - t1, 4),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", required=True, help="HEAD_IP:GCS_PORT")
    ap.add_argument("--timeout", type=float, default=5.0, help="per RPC, seconds")
    ap.add_argument("--max-pending", type=int, default=1000)
    args = ap.parse_args()
    try:
        out = probe(args.address, args.timeout, args.max_pending)
    except Exception as e:  # one line, always
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
