#!/usr/bin/env python3
"""Record a PyTorch CUDA allocation trace, and find the smallest memory cap.

Runs a named training workload on one GPU with
``torch.cuda.memory._record_memory_history(enabled="all", context=None)`` and
writes the snapshot pickle that ``cuarena replay`` reads:

    python3 scripts/pytorch_trace.py resnet50-varbatch --steps 40 --out resnet50.pickle
    python3 scripts/pytorch_trace.py gpt2-varlen --steps 40 --out gpt2.pickle --find-cap

With ``--find-cap`` it also searches, in 1 % steps of the uncapped peak
allocated bytes, for the smallest ``torch.cuda.set_per_process_memory_fraction``
cap under which the run still completes, for the default caching allocator and
for ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Every trial runs in a
fresh subprocess (same seed, so the same batches), and a small table is printed.

Workloads (synthetic data, fixed seed):
  resnet50-varbatch  torchvision ResNet-50, SGD with momentum; batch sizes from
                     {8,16,32,48,64,96,128}, image sizes from {160,192,224,256};
                     a 256-image evaluation pass every 10 steps.
  gpt2-varlen        a small GPT-2-like decoder from torch.nn layers (6 layers,
                     d_model 512, 8 heads, vocabulary 50257), AdamW; batch sizes
                     from {1,2,4,8,16}, sequence lengths from {128,256,512,1024}.
"""

import argparse
import gc
import json
import math
import os
import random
import subprocess
import sys

EXIT_OOM = 3


def resnet50_varbatch(torch, steps, rng, device):
    try:
        import torchvision
    except ImportError:
        sys.exit("resnet50-varbatch needs torchvision (pip install torchvision)")
    model = torchvision.models.resnet50(num_classes=1000).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(steps):
        model.train()
        batch = rng.choice([8, 16, 32, 48, 64, 96, 128])
        size = rng.choice([160, 192, 224, 256])
        x = torch.randn(batch, 3, size, size, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        del x, y, loss
        if (step + 1) % 10 == 0:
            model.eval()
            with torch.no_grad():
                x = torch.randn(256, 3, 224, 224, device=device)
                model(x)
                del x
    torch.cuda.synchronize(device)


def gpt2_varlen(torch, steps, rng, device):
    nn = torch.nn
    vocab, ctx, d, heads, layers = 50257, 1024, 512, 8, 6

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(ctx, d)
            layer = nn.TransformerEncoderLayer(
                d, heads, 4 * d, dropout=0.1, activation="gelu",
                batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight  # tied, as in GPT-2

        def forward(self, idx):
            t = idx.shape[1]
            pos = torch.arange(t, device=idx.device)
            mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
            h = self.tok(idx) + self.pos(pos)
            h = self.blocks(h, mask=mask, is_causal=True)
            return self.head(self.norm(h))

    model = Gpt().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(steps):
        batch = rng.choice([1, 2, 4, 8, 16])
        seq = rng.choice([128, 256, 512, 1024])
        idx = torch.randint(0, vocab, (batch, seq + 1), device=device)
        opt.zero_grad(set_to_none=True)
        logits = model(idx[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        del idx, logits, loss
    torch.cuda.synchronize(device)


WORKLOADS = {"resnet50-varbatch": resnet50_varbatch, "gpt2-varlen": gpt2_varlen}


def run_workload(args, record):
    """Runs the workload once; returns peak allocated/reserved bytes."""
    import torch

    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    if args.cap_bytes:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_bytes / total), device)
    if record:
        # From the very start, so model weights are in the trace too.
        torch.cuda.memory._record_memory_history(enabled="all", context=None)
    # Everything the workload allocates is local to it, so it is all freed
    # (and recorded as freed) before the snapshot is written.
    WORKLOADS[args.workload](torch, args.steps, rng, device)
    gc.collect()
    torch.cuda.synchronize(device)
    if record:
        torch.cuda.memory._dump_snapshot(args.out)
        torch.cuda.memory._record_memory_history(enabled=None)
    return {
        "peak_allocated": torch.cuda.max_memory_allocated(device),
        "peak_reserved": torch.cuda.max_memory_reserved(device),
    }


def trial(args, cap_bytes, alloc_conf):
    """One run in a fresh process; returns its stats, or None on OOM."""
    cmd = [sys.executable, os.path.abspath(__file__), args.workload,
           "--steps", str(args.steps), "--seed", str(args.seed),
           "--device", args.device, "--child"]
    if cap_bytes:
        cmd += ["--cap-bytes", str(cap_bytes)]
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode == EXIT_OOM:
        return None
    if p.returncode != 0:
        sys.exit(f"trial failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def find_cap(args):
    rows = []
    for label, conf in [("caching allocator (default)", None),
                        ("caching allocator, expandable_segments:True", "expandable_segments:True")]:
        base = trial(args, None, conf)
        if base is None:
            sys.exit(f"{label}: out of memory even without a cap")
        peak = base["peak_allocated"]
        # Percent of peak allocated: lo fails (or is the bound), hi completes.
        lo, hi = 99, max(100, math.ceil(100 * base["peak_reserved"] / peak))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            print(f"  {label}: trying cap {mid} % of peak allocated ...", flush=True)
            if trial(args, peak * mid // 100, conf) is None:
                lo = mid
            else:
                hi = mid
        best = peak * hi // 100
        rows.append((label, base["peak_reserved"], best, best / peak, peak))
    print()
    print("| allocator | peak allocated | peak reserved, uncapped | smallest cap that completed | cap / peak allocated |")
    print("| --- | --- | --- | --- | --- |")
    for label, reserved, cap, ratio, peak in rows:
        print(f"| {label} | {peak / 1e9:.2f} GB | {reserved / 1e9:.2f} GB | {cap / 1e9:.2f} GB | {ratio:.3f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--out", help="snapshot pickle to write (default WORKLOAD.pickle)")
    ap.add_argument("--find-cap", action="store_true",
                    help="search for the smallest memory cap that completes")
    ap.add_argument("--cap-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        # A --find-cap trial: no recording; exit EXIT_OOM on out-of-memory.
        import torch
        try:
            stats = run_workload(args, record=False)
        except torch.cuda.OutOfMemoryError:
            sys.exit(EXIT_OOM)
        print(json.dumps(stats))
        return

    args.out = args.out or f"{args.workload}.pickle"
    stats = run_workload(args, record=True)
    print(f"wrote {args.out}")
    print(f"peak allocated {stats['peak_allocated']:,} B ({stats['peak_allocated'] / 2**30:.2f} GiB), "
          f"peak reserved {stats['peak_reserved']:,} B ({stats['peak_reserved'] / 2**30:.2f} GiB)")
    if args.find_cap:
        find_cap(args)


if __name__ == "__main__":
    main()
