#!/usr/bin/env python3
"""The two-tenant experiment's Python half (scripts/two-tenants.sh runs it).

  two_tenants.py tenant --name A --peak-bytes N --turns DIR [--empty-cache]
      The PyTorch tenant: the same phases as the Rust one
      (crates/cuarena-demo/examples/two_tenants.rs), on PyTorch's allocator
      (PYTORCH_CUDA_ALLOC_CONF as set in the environment). Without torch or a
      GPU it prints why and exits with status 0.
  two_tenants.py sample --out CSV --variant-file F --stop F [--interval-ms 50]
      Samples the device memory each process holds (NVML through pynvml when
      it is installed, else nvidia-smi) until the file --stop exists.
  two_tenants.py plot --dir OUT --total-mib M
      Draws OUT/samples.csv as OUT/two_tenants.svg (one panel per variant) and
      prints the table of what completed and the peak each process held.

Protocol (files in --turns DIR): the tenant writes ready.NAME once its CUDA
context exists; for each phase i it waits for go.NAME.i, runs the phase and
writes done.NAME.i; a failure writes failed.NAME.
"""
import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

MASK = (1 << 64) - 1


class Rng:
    """splitmix64: the same sequence as the Rust tenant's."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def tensor_bytes(self):
        r = self.next()
        mib = 1 + (r >> 1) % 64 if r & 1 else 64 + (r >> 1) % 961
        return (mib << 20) - ((r >> 40) % 4096) * 4


def wait_for(path, timeout_s=600.0):
    t0 = time.monotonic()
    while not path.exists():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"no turn: {path} never appeared")
        time.sleep(0.002)


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def run_phase(torch, a, phase):
    """Fill to the peak, churn, hold, check, free (and empty the cache).
    Returns the words of live tensors that lost their pattern."""
    started = time.monotonic()
    print(f"EVENT t={time.time():.3f} {a.name} phase {phase} start", flush=True)
    rng = Rng(a.seed ^ (phase << 32))
    live = []
    next_id = [1]

    def refill():
        held = sum(t.numel() * 4 for t, _ in live)
        while True:
            b = rng.tensor_bytes()
            if held + b > a.peak_bytes:
                return
            t = torch.empty(b // 4, dtype=torch.int32, device="cuda")
            pattern = 0x5EED0000 ^ next_id[0]
            t.fill_(pattern)
            live.append((t, pattern))
            next_id[0] += 1
            held += b

    refill()
    churn = Rng(a.seed ^ 0xC4 ^ phase)
    for _ in range(a.rounds):
        live[:] = [x for x in live if churn.next() % 3 != 0]
        refill()
        torch.cuda.synchronize()
    live_peak = torch.cuda.memory_allocated()
    reserved_peak = torch.cuda.memory_reserved()
    passes = 0
    while time.monotonic() - started < a.hold_ms / 1000 or passes == 0:
        for t, p in live:
            t.fill_(p)
        torch.cuda.synchronize()
        passes += 1
    bad = 0
    for t, p in live:
        bad += int((t[:256] != p).sum().item()) + int((t[-256:] != p).sum().item())
    tensors = len(live)
    live.clear()
    before = torch.cuda.memory_reserved()
    if a.empty_cache:
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    print(
        f"{a.name} phase {phase}: {tensors} tensors, {gib(live_peak)} live at the end, "
        f"{gib(reserved_peak)} reserved at the peak, {passes} fill passes, {bad} wrong words; "
        f"reserved {gib(before)} after freeing, {gib(torch.cuda.memory_reserved())} after "
        f"{'empty_cache' if a.empty_cache else 'the phase (no empty_cache)'} "
        f"in {time.monotonic() - started:.2f} s",
        flush=True,
    )
    print(f"EVENT t={time.time():.3f} {a.name} phase {phase} end", flush=True)
    return bad


def tenant(a):
    try:
        import torch
    except ImportError:
        print("two_tenants.py: skipped: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("two_tenants.py: skipped: torch sees no CUDA GPU")
        return 0
    turns = Path(a.turns)
    failed = turns / f"failed.{a.name}"
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "default"
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    print(
        f"{a.name} pid {os.getpid()}: PyTorch {torch.__version__} on "
        f"{torch.cuda.get_device_name()}, allocator {conf}, empty_cache after each phase: "
        f"{'yes' if a.empty_cache else 'no'}",
        flush=True,
    )
    (turns / f"ready.{a.name}").write_text(str(os.getpid()))
    done = 0
    for phase in range(a.phases):
        try:
            wait_for(turns / f"go.{a.name}.{phase}")
            bad = run_phase(torch, a, phase)
            if bad:
                raise RuntimeError(f"{bad} words of live tensors lost their pattern")
        except (torch.OutOfMemoryError, RuntimeError, TimeoutError) as e:
            kind = "out of memory: " if isinstance(e, torch.OutOfMemoryError) else ""
            line = f"FAILED phase {phase}: {kind}{str(e).splitlines()[0]}"
            print(f"{a.name} {line}", flush=True)
            failed.write_text(line)
            break
        done += 1
        (turns / f"done.{a.name}.{phase}").write_text("")
    print(
        f"RESULT tenant={a.name} mode=torch:{conf} phases={done}/{a.phases} "
        f"peak_reserved_bytes={torch.cuda.max_memory_reserved()} "
        f"peak_live_bytes={torch.cuda.max_memory_allocated()}",
        flush=True,
    )
    return 0 if done == a.phases else 1


def sampler():
    """A function returning [(pid, used MiB)] for the processes on GPU 0."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)

        def nvml():
            return [
                (p.pid, (p.usedGpuMemory or 0) / 2**20)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            ]

        nvml()
        return "NVML (pynvml)", nvml
    except Exception:  # no pynvml, or one that does not match the driver
        pass
    cmd = [
        "nvidia-smi", "-i", "0", "--query-compute-apps=pid,used_memory",
        "--format=csv,noheader,nounits",
    ]

    def smi():
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
        rows = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                rows.append((int(parts[0]), float(parts[1])))
        return rows

    return "nvidia-smi --query-compute-apps", smi


def sample(a):
    source, query = sampler()
    stop, variant_file = Path(a.stop), Path(a.variant_file)
    n, t_first = 0, time.time()
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "t_unix", "pid", "used_mib"])
        while not stop.exists():
            t = time.time()
            try:
                variant = variant_file.read_text().strip()
                rows = query()
            except Exception as e:  # a failed query is a gap, not the end
                print(f"two_tenants.py sample: {e}", file=sys.stderr)
                variant, rows = "", []
            # pid 0: the tick itself, so that absent processes read as 0.
            for pid, mib in [(0, 0.0)] + rows:
                w.writerow([variant, f"{t:.3f}", pid, f"{mib:.0f}"])
            n += 1
            time.sleep(max(0.0, a.interval_ms / 1000 - (time.time() - t)))
    span = time.time() - t_first
    print(f"sampler: {source}, {n} samples in {span:.1f} s ({1000 * span / max(n, 1):.0f} ms each)")


# ---- the picture -----------------------------------------------------------

COLORS = {"A": "#1f77b4", "B": "#e6550d"}
TITLES = {
    "elastic": "(a) cuarena, elastic arenas (trim after each phase)",
    "fixed": "(b) cuarena, fixed arenas sized for the peak",
    "torch-default": "(c) PyTorch, default caching allocator (no empty_cache)",
    "torch-expandable": "(c') PyTorch, expandable_segments:True + empty_cache()",
}


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def series(samples, results, variant):
    """{tenant: [(t, MiB)]} over the variant's ticks, and its t0."""
    rows = [r for r in samples if r["variant"] == variant]
    ticks = sorted({float(r["t_unix"]) for r in rows})
    if not ticks:
        return {}, 0.0
    by_pid = {}
    for r in rows:
        if r["pid"] != "0":
            by_pid.setdefault(int(r["pid"]), {})[float(r["t_unix"])] = float(r["used_mib"])
    names = {int(r["pid"]): r["tenant"] for r in results if r["variant"] == variant}
    # nvidia-smi in a container may report other pids: match by first sight.
    unknown = sorted((p for p in by_pid if p not in names), key=lambda p: min(by_pid[p]))
    free = [r["tenant"] for r in results if r["variant"] == variant and int(r["pid"]) not in by_pid]
    for p, n in zip(unknown, free):
        names[p] = n
    out = {}
    for p, used in by_pid.items():
        if p in names:
            out[names[p]] = [(t - ticks[0], used.get(t, 0.0)) for t in ticks]
    for r in results:
        if r["variant"] == variant:
            out.setdefault(r["tenant"], [(t - ticks[0], 0.0) for t in ticks])
    return out, ticks[0]


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel(y0, title, data, bands, outcome, notes, total_gib, x_max):
    W, H, L = 900, 170, 60
    T = 38 + 14 * len(notes)
    ymax = max(total_gib * 1.1, 1.0)
    sx = lambda t: L + t / x_max * (W - L - 20)
    sy = lambda g: y0 + T + H - g / ymax * H
    s = [f'<text x="{L}" y="{y0 + 16}" font-size="14" font-weight="bold">{esc(title)}</text>',
         f'<text x="{L}" y="{y0 + 31}" font-size="12" fill="#333">{esc(outcome)}</text>']
    for i, note in enumerate(notes):
        s.append(f'<text x="{L}" y="{y0 + 45 + 14 * i}" font-size="11" fill="#a00">{esc(note[:140])}</text>')
    s.append(f'<text x="{L - 40}" y="{y0 + T + H / 2:.0f}" font-size="10" '
             f'transform="rotate(-90 {L - 40} {y0 + T + H / 2:.0f})" text-anchor="middle">GiB</text>')
    s.append(f'<text x="{W - 20}" y="{y0 + T + H + 25}" font-size="10" text-anchor="end">seconds</text>')
    for name, t_a, t_b in bands:
        s.append(f'<rect x="{sx(t_a):.1f}" y="{y0 + T}" width="{max(sx(t_b) - sx(t_a), 1):.1f}" '
                 f'height="{H}" fill="{COLORS.get(name, "#888")}" opacity="0.08"/>')
    step = 20 if total_gib > 60 else 10
    g = 0
    while g <= ymax:
        s.append(f'<line x1="{L}" x2="{W - 20}" y1="{sy(g):.1f}" y2="{sy(g):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{L - 6}" y="{sy(g) + 4:.1f}" font-size="10" text-anchor="end">{g}</text>')
        g += step
    xs = 5 if x_max > 15 else 2
    t = 0
    while t <= x_max:
        s.append(f'<text x="{sx(t):.1f}" y="{y0 + T + H + 13}" font-size="10" text-anchor="middle">{t}</text>')
        t += xs
    s.append(f'<line x1="{L}" x2="{W - 20}" y1="{sy(total_gib):.1f}" y2="{sy(total_gib):.1f}" '
             f'stroke="#c00" stroke-dasharray="6,4"/>')
    s.append(f'<text x="{W - 22}" y="{sy(total_gib) - 4:.1f}" font-size="10" fill="#c00" '
             f'text-anchor="end">GPU memory {total_gib:.1f} GiB</text>')
    names = sorted(data)
    if len(names) > 1:
        n = len(data[names[0]])
        tot = [(data[names[0]][i][0], sum(data[k][i][1] for k in names)) for i in range(n)]
        pts = " ".join(f"{sx(t):.1f},{sy(m / 1024):.1f}" for t, m in tot)
        s.append(f'<polyline points="{pts}" fill="none" stroke="#555" stroke-width="1" '
                 f'stroke-dasharray="2,2"/>')
    for name in names:
        pts = " ".join(f"{sx(t):.1f},{sy(m / 1024):.1f}" for t, m in data[name])
        s.append(f'<polyline points="{pts}" fill="none" stroke="{COLORS.get(name, "#888")}" '
                 f'stroke-width="1.8"/>')
    s.append(f'<rect x="{L}" y="{y0 + T}" width="{W - L - 20}" height="{H}" fill="none" stroke="#999"/>')
    return s, T + H + 30


def plot(a):
    d = Path(a.dir)
    samples, results = read_csv(d / "samples.csv"), read_csv(d / "results.csv")
    events = read_csv(d / "events.csv") if (d / "events.csv").exists() else []
    total_gib = a.total_mib / 1024
    variants = [v for v in TITLES if any(r["variant"] == v for r in results)]
    panels, x_max = {}, 1.0
    for v in variants:
        data, t0 = series(samples, results, v)
        panels[v] = (data, t0)
        for pts in data.values():
            x_max = max(x_max, pts[-1][0] if pts else 0)
    x_max = float(int(x_max) + 1)
    svg, y = [], 34
    table = []
    for v in variants:
        data, t0 = panels[v]
        rs = [r for r in results if r["variant"] == v]
        outcome, notes = [], []
        for r in rs:
            peak = max((m for _, m in data.get(r["tenant"], [])), default=0.0)
            ok = r["phases_done"] == r["phases"] and r["exit"] == "0"
            outcome.append(f"{r['tenant']}: {r['phases_done']}/{r['phases']} phases"
                           f"{'' if ok else ', failed'}, peak {peak / 1024:.1f} GiB")
            if not ok:
                notes.append(r["message"])
            table.append((v, r["tenant"], "completed" if ok else "FAILED",
                          f"{r['phases_done']}/{r['phases']}", f"{peak / 1024:.2f}", r["message"]))
        starts = {}
        bands = []
        for e in events:
            if e["variant"] != v:
                continue
            k = (e["tenant"], e["phase"])
            if e["what"] == "start":
                starts[k] = float(e["t_unix"]) - t0
            elif k in starts:
                bands.append((e["tenant"], starts.pop(k), float(e["t_unix"]) - t0))
        n = len(next(iter(data.values()), []))
        both = max((sum(p[i][1] for p in data.values()) for i in range(n)), default=0.0)
        outcome.append(f"together at most {both / 1024:.1f} GiB")
        part, h = panel(y, TITLES[v], data, bands, "; ".join(outcome), notes, total_gib, x_max)
        svg += part
        y += h
    head = [f'<svg xmlns="http://www.w3.org/2000/svg" width="900" height="{y + 10}" '
            f'font-family="sans-serif" viewBox="0 0 900 {y + 10}">',
            '<rect width="100%" height="100%" fill="white"/>',
            f'<text x="60" y="20" font-size="15" font-weight="bold">{esc(a.title)}</text>']
    legend = []
    for i, (name, c) in enumerate(COLORS.items()):
        legend.append(f'<line x1="{560 + i * 110}" x2="{585 + i * 110}" y1="15" y2="15" '
                      f'stroke="{c}" stroke-width="2"/><text x="{590 + i * 110}" y="19" '
                      f'font-size="12">tenant {name}</text>')
    legend.append('<line x1="780" x2="805" y1="15" y2="15" stroke="#555" stroke-dasharray="2,2"/>'
                  '<text x="810" y="19" font-size="12">A + B</text>')
    foot = (f'<text x="60" y="{y + 2}" font-size="10" fill="#555">GiB held per process '
            f'(nvidia-smi / NVML) against seconds; shaded: each tenant\'s phases</text>')
    (d / "two_tenants.svg").write_text("\n".join(head + legend + svg + [foot, "</svg>"]) + "\n")
    print(f"\n{'variant':18} {'tenant':6} {'result':10} {'phases':6} {'peak GiB':>8}  message")
    for row in table:
        print(f"{row[0]:18} {row[1]:6} {row[2]:10} {row[3]:6} {row[4]:>8}  {row[5]}")
    print(f"\nwrote {d / 'two_tenants.svg'}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tenant")
    t.add_argument("--name", required=True)
    t.add_argument("--peak-bytes", type=int, required=True)
    t.add_argument("--turns", required=True)
    t.add_argument("--phases", type=int, default=3)
    t.add_argument("--rounds", type=int, default=4)
    t.add_argument("--hold-ms", type=int, default=1500)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--empty-cache", action="store_true")
    s = sub.add_parser("sample")
    s.add_argument("--out", required=True)
    s.add_argument("--variant-file", required=True)
    s.add_argument("--stop", required=True)
    s.add_argument("--interval-ms", type=float, default=50)
    g = sub.add_parser("plot")
    g.add_argument("--dir", required=True)
    g.add_argument("--total-mib", type=float, required=True)
    g.add_argument("--title", default="Two tenants on one GPU")
    a = p.parse_args()
    return {"tenant": tenant, "sample": sample, "plot": plot}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
