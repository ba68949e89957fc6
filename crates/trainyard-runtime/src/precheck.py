"""Trainyard resource precheck.

Run by the platform inside every replica of a distributed PyTorch job, before
the user's command, with MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK already
in the environment. It checks, timing each step, that:

  1. the replicas can form a process group ("nccl" when CUDA is available,
     else "gloo") on MASTER_PORT + --port-offset, so the user's job can still
     take MASTER_PORT right after;
  2. every visible GPU (or the CPU when there is none) reaches a float32 GEMM
     throughput of at least --min-gemm-gflops GFLOP/s;
  3. an all-reduce across all ranks reaches at least --min-allreduce-gbps GB/s
     of bus bandwidth, bytes * 2(n-1)/n / time (with a single rank there is no
     bus, so the algorithm bandwidth bytes / time is reported instead).

A threshold of 0 (the default) only measures. The result goes to --out as JSON
and the one-line summary is printed. Exit codes: 0 all good, 1 a threshold was
not met, 2 a step failed or the watchdog fired, 3 torch is not installed.
"""
import argparse
import datetime
import json
import os
import signal
import sys
import threading
import time

OK, SHORT, ERROR, NO_TORCH = 0, 1, 2, 3
_finish_lock = threading.Lock()
_current = {"step": "environment"}  # what the watchdog reports as hanging


def finish(result, out, code, message):
    """Write the result file, print the summary and leave at once, whatever
    state the process group is in (the watchdog may call this from a thread)."""
    with _finish_lock:
        result.update(ok=code == OK, message=message)
        try:
            with open(out, "w") as f:
                json.dump(result, f, indent=2)
                f.write("\n")
        except OSError as e:
            print(f"precheck: cannot write {out}: {e}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # one write, so the lines of replicas sharing a terminal do not interleave
        os.write(1 if code in (OK, SHORT) else 2, (message + "\n").encode())
        os._exit(code)


def arm_watchdog(seconds, result, out):
    """SIGALRM after `seconds`; a thread a little later in case the main thread
    is stuck inside a C call and cannot run the signal handler."""
    def give_up(*_):
        finish(result, out, ERROR, f"rank {result['rank']}: precheck gave up after {seconds} s "
               f"(watchdog), still in step '{_current['step']}'")
    signal.signal(signal.SIGALRM, give_up)
    signal.alarm(seconds)
    timer = threading.Timer(seconds + 5, give_up)
    timer.daemon = True
    timer.start()


def gemm_gflops(torch, device, n, budget_s=0.3, max_reps=50):
    """Square float32 matmuls after a warm-up, repeated until about budget_s
    has passed (at least twice), so a slow BLAS does not stretch the check."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)  # warm-up
    sync()
    reps, start = 0, time.perf_counter()
    while reps < 2 or (reps < max_reps and time.perf_counter() - start < budget_s):
        torch.mm(a, b)
        sync()
        reps += 1
    return 2 * n ** 3 * reps / (time.perf_counter() - start) / 1e9


def allreduce_gbps(torch, dist, device, mib, iters, world):
    x = torch.ones(mib * 2 ** 20 // 4, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):  # warm-up (NCCL builds its communicator here)
        dist.all_reduce(x)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync()
    per_op = (time.perf_counter() - start) / iters
    factor = 2 * (world - 1) / world if world > 1 else 1.0
    return x.numel() * 4 * factor / per_op / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where to write the JSON result")
    p.add_argument("--min-gemm-gflops", type=float, default=0.0)
    p.add_argument("--min-allreduce-gbps", type=float, default=0.0)
    p.add_argument("--timeout-s", type=int, default=120, help="rendezvous/collective timeout")
    p.add_argument("--port-offset", type=int, default=1, help="rendezvous on MASTER_PORT + this")
    args = p.parse_args()

    result = {"ok": False, "rank": None, "world_size": None, "backend": None, "init_s": None,
              "gemm_gflops": [], "allreduce_gbps": None, "message": "", "failures": []}
    arm_watchdog(args.timeout_s + 30, result, args.out)
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + args.port_offset
    except (KeyError, ValueError) as e:
        finish(result, args.out, ERROR, "precheck failed in step 'environment': RANK, WORLD_SIZE, "
               f"MASTER_ADDR and MASTER_PORT must be set to integers/an address ({e!r})")
    result.update(rank=rank, world_size=world)

    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        finish(result, args.out, NO_TORCH, f"rank {rank}: the image has no usable torch ({e}); the "
               "resource precheck needs it: use an image with torch or turn the precheck off")

    _current["step"] = "init"
    try:
        cuda = torch.cuda.is_available()
        backend = "nccl" if cuda else "gloo"
        result["backend"] = backend
        if cuda:  # one device per rank for NCCL; replicas on one host must not share it
            local = int(os.environ.get("LOCAL_RANK", rank))
            torch.cuda.set_device(local % torch.cuda.device_count())
        start = time.perf_counter()
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", world_size=world,
                                rank=rank, timeout=datetime.timedelta(seconds=args.timeout_s))
        result["init_s"] = round(time.perf_counter() - start, 3)

        _current["step"] = "gemm"
        if cuda:
            devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
            result["gemm_gflops"] = [round(gemm_gflops(torch, d, 8192), 1) for d in devices]
        else:
            devices = [torch.device("cpu")]
            result["gemm_gflops"] = [round(gemm_gflops(torch, devices[0], 1024), 1)]

        _current["step"] = "all-reduce"
        ar_device = torch.device("cuda", torch.cuda.current_device()) if cuda else devices[0]
        mib, iters = (64, 20) if cuda else (8, 10)
        result["allreduce_gbps"] = round(allreduce_gbps(torch, dist, ar_device, mib, iters, world), 2)

        _current["step"] = "destroy"
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 -- any failure of a step is reported, not raised
        finish(result, args.out, ERROR, f"rank {rank}: precheck failed in step '{_current['step']}' "
               f"({result['backend']}, {world} ranks via {addr}:{port}): {type(e).__name__}: {e}")

    names = [str(d) for d in devices]
    for name, g in zip(names, result["gemm_gflops"]):
        if g < args.min_gemm_gflops:
            result["failures"].append(f"GEMM on {name}: {g} GFLOP/s, below the minimum "
                                      f"{args.min_gemm_gflops:g} by {args.min_gemm_gflops - g:.1f}")
    bw = result["allreduce_gbps"]
    if bw < args.min_allreduce_gbps:
        result["failures"].append(f"all-reduce: {bw} GB/s, below the minimum "
                                  f"{args.min_allreduce_gbps:g} by {args.min_allreduce_gbps - bw:.2f}")

    gemm = ", ".join(f"{g:.1f}" for g in result["gemm_gflops"])
    where = "cpu" if not cuda else f"{len(names)} GPU" + ("s" if len(names) > 1 else "")
    ar = (f"all-reduce {bw:.2f} GB/s bus bandwidth over {world} ranks" if world > 1 else
          f"all-reduce {bw:.2f} GB/s (algorithm bandwidth, single rank)")
    message = (f"rank {rank}: {backend} init {result['init_s']:.2f} s, GEMM {gemm} GFLOP/s ({where}), "
               f"{ar}")
    if result["failures"]:
        message += "; FAILED: " + "; ".join(result["failures"])
    finish(result, args.out, SHORT if result["failures"] else OK, message)


if __name__ == "__main__":
    main()
