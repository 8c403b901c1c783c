#!/usr/bin/env python3
"""PyTorch reference for the Rust GPT-2 training loop: same weights, same batches.

Subcommands (``--help`` on each lists every option):

  init      write DIR/gpt2_init.safetensors: a randomly initialised GPT-2 small
            (fp32, HF names without "transformer.", Conv1D layout in x out, LM
            head tied to wte, so not saved) and the batches ``tokens.{s}``
            (int32, (B_s, T_s + 1): input [:, :T], target [:, 1:]), drawn from a
            seeded Zipf-weighted order-1 Markov chain (4 likely successors per
            token), so the loss falls. Hyper-parameters go in the metadata.
      python3 scripts/gpt2_reference.py init --out data --steps 100 --seed 0

  train     train on those weights and batches with AdamW (weight decay on every
            parameter, one group, constant lr) and clip_grad_norm_, and write the
            losses, grad norms (before clipping), throughput and peak memory.
            fp32 disables TF32 (matmul and cuDNN); bf16 keeps fp32 weights and
            runs forward + loss under torch.autocast(bfloat16). Batches sit in
            pinned host memory and are uploaded (non_blocking) inside each step,
            so the upload is timed. Timing: steps 1..N-1 (step 0 is warm-up).
            OOM exits with code 3 after writing {"ok": false, "failed_step": s}
            (-1: while loading the model).
      python3 scripts/gpt2_reference.py train --init data/gpt2_init.safetensors \\
          --precision fp32 --json torch_fp32.json --grads-out torch_grads0.safetensors

  find-cap  smallest per-process memory cap (in whole percent of the uncapped peak
            allocated bytes) under which the run completes, for the default
            caching allocator and for expandable_segments:True; every trial is a
            fresh ``train --cap-bytes`` subprocess on the same batches.
      python3 scripts/gpt2_reference.py find-cap --init data/gpt2_init.safetensors \\
          --precision bf16 --json cap_bf16.json --steps 30

  compare   compare two JSON files' "losses" lists (relative difference to torch's).
      python3 scripts/gpt2_reference.py compare --torch torch_fp32.json --rust rust_fp32.json

``--device cpu --tiny`` (init: n_embd 64, 2 layers, 4 heads, 128 positions,
vocab 512) checks the script on a machine without a GPU.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

EXIT_OOM = 3
HYPER = {"lr": "3e-4", "beta1": "0.9", "beta2": "0.95", "eps": "1e-8",
         "weight_decay": "0.1", "grad_clip": "1.0"}
FULL = dict(vocab=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
TINY = dict(vocab=512, n_positions=128, n_embd=64, n_layer=2, n_head=4)


def fail(msg):
    sys.exit(f"gpt2_reference.py: error: {msg}")


def gpt2_config(dims):
    from transformers import GPT2Config
    v = int(dims["vocab"])
    return GPT2Config(vocab_size=v, n_positions=int(dims["n_positions"]),
                      n_embd=int(dims["n_embd"]), n_layer=int(dims["n_layer"]),
                      n_head=int(dims["n_head"]), resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                      activation_function="gelu_new", use_cache=False,
                      bos_token_id=v - 1, eos_token_id=v - 1)


def markov_batches(steps, seed, vocab, min_b, max_b, min_len, max_len):
    """Token batches: shapes from random.Random(seed), tokens from numpy's
    default_rng(seed). Each token has 4 successors (probabilities .55 .25 .12
    .05) drawn from a Zipf(1) law over a random permutation of the vocabulary;
    with probability .03 the next token is drawn from that Zipf law instead."""
    import numpy as np
    shapes = random.Random(seed)
    rng = np.random.default_rng(seed)
    zipf = 1.0 / (np.arange(vocab) + 10.0)
    zipf_cdf = np.cumsum(zipf / zipf.sum())
    perm = rng.permutation(vocab)

    def draw(u):
        return perm[np.minimum(np.searchsorted(zipf_cdf, u), vocab - 1)]

    succ = draw(rng.random((vocab, 4)))
    succ_cdf = np.cumsum([0.55, 0.25, 0.12, 0.05])
    succ_cdf /= succ_cdf[-1]
    out = []
    for _ in range(steps):
        b, t = shapes.randint(min_b, max_b), shapes.randint(min_len, max_len)
        seq = np.empty((b, t + 1), dtype=np.int64)
        seq[:, 0] = draw(rng.random(b))
        which = np.searchsorted(succ_cdf, rng.random((b, t)))
        noise = rng.random((b, t)) < 0.03
        jump = draw(rng.random((b, t)))
        for i in range(t):
            seq[:, i + 1] = np.where(noise[:, i], jump[:, i], succ[seq[:, i], which[:, i]])
        out.append(seq.astype(np.int32))
    return out


def cmd_init(args):
    import torch
    from safetensors.torch import save_file
    from transformers import GPT2LMHeadModel
    dims = dict(TINY if args.tiny else FULL)
    max_len = min(args.max_len, dims["n_positions"])
    min_len = min(args.min_len, max_len)
    if args.steps < 1 or not 1 <= args.min_batch <= args.max_batch or min_len < 1:
        fail("need --steps >= 1, 1 <= --min-batch <= --max-batch, --min-len >= 1")
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(gpt2_config(dims))
    tensors = {name: p.detach().float().contiguous().clone()
               for name, p in model.transformer.named_parameters()}
    batches = markov_batches(args.steps, args.seed, dims["vocab"], args.min_batch,
                             args.max_batch, min_len, max_len)
    for s, seq in enumerate(batches):
        tensors[f"tokens.{s}"] = torch.from_numpy(seq)
    meta = {k: str(v) for k, v in dims.items()}
    meta.update(HYPER, steps=str(args.steps), seed=str(args.seed),
                min_batch=str(args.min_batch), max_batch=str(args.max_batch),
                min_len=str(min_len), max_len=str(max_len), layer_norm_epsilon="1e-5",
                activation="gelu_new (tanh form)", tiny=str(bool(args.tiny)).lower())
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpt2_init.safetensors")
    save_file(tensors, path, metadata=meta)
    n_params = sum(t.numel() for k, t in tensors.items() if not k.startswith("tokens."))
    n_tok = sum(b.shape[0] * (b.shape[1] - 1) for b in batches)
    print(f"wrote {path}: {n_params:,} parameters, {args.steps} batches, "
          f"{n_tok:,} input tokens, {os.path.getsize(path) / 1e6:.1f} MB")


def load_init(path):
    from safetensors import safe_open
    from safetensors.torch import load_file
    if not os.path.isfile(path):
        fail(f"init file not found: {path}")
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    missing = [k for k in ["steps", "vocab", "n_layer", "n_head", "n_embd", "n_positions", *HYPER]
               if k not in meta]
    if missing:
        fail(f"{path}: metadata lacks {', '.join(missing)} (not written by `init`?)")
    return meta, load_file(path)


def cmd_train(args):
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from transformers import GPT2LMHeadModel
    meta, tensors = load_init(args.init)
    n_steps = args.steps or int(meta["steps"])
    if not 1 <= n_steps <= int(meta["steps"]):
        fail(f"--steps must be in 1..{meta['steps']} (the init file's batches)")
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        fail("CUDA is not available (use --device cpu for a check without a GPU)")
    if cuda:
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        dev = torch.device("cuda", idx)
        if args.cap_bytes:
            total = torch.cuda.get_device_properties(idx).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_bytes / total), idx)
    if args.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False  # true fp32 GEMMs, no TF32
        torch.backends.cudnn.allow_tf32 = False
    lr, wd, clip = float(meta["lr"]), float(meta["weight_decay"]), float(meta["grad_clip"])
    betas, eps = (float(meta["beta1"]), float(meta["beta2"])), float(meta["eps"])
    vocab = int(meta["vocab"])
    params = {k: v for k, v in tensors.items() if not k.startswith("tokens.")}
    batches = [tensors[f"tokens.{s}"] for s in range(n_steps)]
    if cuda:
        batches = [b.pin_memory() for b in batches]
    alloc = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "default"
    result = {"precision": args.precision, "allocator": alloc, "cap_bytes": args.cap_bytes,
              "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
              "torch": torch.__version__, "steps": n_steps}
    losses, norms, step = [], [], -1
    try:
        model = GPT2LMHeadModel(gpt2_config(meta))
        names = {n for n, _ in model.transformer.named_parameters()}
        if names != set(params):
            fail(f"parameter names differ: missing {sorted(names - set(params))[:5]}, "
                 f"extra {sorted(set(params) - names)[:5]}")
        miss, unexp = model.load_state_dict({"transformer." + k: v for k, v in params.items()},
                                            strict=False)
        if [k for k in miss if k != "lm_head.weight"] or unexp:
            fail(f"load_state_dict: missing {miss}, unexpected {unexp}")
        model.to(dev).train()
        if model.lm_head.weight is not model.transformer.wte.weight:
            fail("lm_head is not tied to wte")
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=wd)
        amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
        t0, tokens = None, 0
        for step in range(n_steps):
            if step == 1:
                if cuda:
                    torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
            d = batches[step].to(dev, non_blocking=True).long()
            x, y = d[:, :-1], d[:, 1:]
            if step >= 1:
                tokens += x.numel()
            with amp:
                logits = model(x, use_cache=False).logits
                loss = F.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
            loss.backward()
            if step == 0 and args.grads_out:
                grads = {n: p.grad.detach().float().cpu().clone()
                         for n, p in model.transformer.named_parameters()}
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if step == 0 and args.grads_out:
                save_file(grads, args.grads_out, metadata={
                    "grad_norm": repr(norm.item()), "loss": repr(loss.item()),
                    "precision": args.precision})
                del grads
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            norms.append(norm.detach())
            del logits, loss
            if step % 10 == 0 or step == n_steps - 1:
                print(f"step {step:4d}/{n_steps}  B={x.shape[0]:3d} T={x.shape[1]:5d}  "
                      f"loss {losses[-1].item():.6f}  grad_norm {norms[-1].item():.4f}", flush=True)
        if cuda:
            torch.cuda.synchronize(dev)
        elapsed = time.perf_counter() - t0 if t0 is not None else None
    except torch.OutOfMemoryError:
        result.update(ok=False, failed_step=step)
        write_json(args.json, result)
        print(f"out of memory at step {step} (cap_bytes={args.cap_bytes}, allocator {alloc})",
              file=sys.stderr)
        sys.exit(EXIT_OOM)
    result.update(
        losses=[v.item() for v in losses], grad_norms=[v.item() for v in norms],
        tokens=tokens, time_s=elapsed,
        tokens_per_s=tokens / elapsed if elapsed else None,
        peak_allocated_bytes=torch.cuda.max_memory_allocated(dev) if cuda else None,
        peak_reserved_bytes=torch.cuda.max_memory_reserved(dev) if cuda else None, ok=True)
    write_json(args.json, result)
    tput = f"{result['tokens_per_s']:,.0f} tokens/s over steps 1..{n_steps - 1}" if elapsed else "no timed steps"
    mem = (f"; peak allocated {result['peak_allocated_bytes'] / 2**30:.2f} GiB, reserved "
           f"{result['peak_reserved_bytes'] / 2**30:.2f} GiB" if cuda else "")
    print(f"{args.precision}: final loss {result['losses'][-1]:.6f}; {tput}{mem}; wrote {args.json}")


def write_json(path, obj):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def run_train(args, tmp, name, cap_bytes=None, expandable=False):
    """One `train` in a fresh process; returns its JSON, or None on OOM."""
    out = os.path.join(tmp, name + ".json")
    cmd = [sys.executable, os.path.abspath(__file__), "train", "--init", args.init,
           "--precision", args.precision, "--json", out, "--device", args.device]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    if cap_bytes:
        cmd += ["--cap-bytes", str(cap_bytes)]
    if expandable:
        cmd += ["--expandable"]
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode == EXIT_OOM:
        return None
    if p.returncode != 0:
        fail(f"trial {name} failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)


def cmd_find_cap(args):
    if not args.device.startswith("cuda"):
        fail("find-cap needs a CUDA device")
    load_init(args.init)  # clear error before starting subprocesses
    report = {"precision": args.precision, "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        print("uncapped run (default allocator) ...", flush=True)
        base = run_train(args, tmp, "uncapped")
        if base is None:
            fail("out of memory even without a cap")
        peak = base["peak_allocated_bytes"]
        report.update(peak_allocated_bytes=peak, device=base["device"], steps=base["steps"])
        for key, expandable in [("default", False), ("expandable", True)]:
            if expandable:
                print("uncapped run (expandable_segments:True) ...", flush=True)
                unc = run_train(args, tmp, "uncapped_exp", expandable=True)
                if unc is None:
                    fail("out of memory even without a cap (expandable segments)")
            else:
                unc = base
            reserved = unc["peak_reserved_bytes"]
            trials = []

            def fits(k):
                cap = peak * k // 100
                print(f"  {key}: cap {k}% of peak allocated ({cap / 2**30:.2f} GiB) ...",
                      end=" ", flush=True)
                ok = run_train(args, tmp, f"{key}_{k}", cap, expandable) is not None
                print("completed" if ok else "out of memory", flush=True)
                trials.append({"percent": k, "cap_bytes": cap, "ok": ok})
                return ok

            # Invariant: lo fails (99 % < peak allocated cannot fit), hi fits.
            # Start at the uncapped peak reserved, gallop up if that fails,
            # then bisect.
            lo, hi, inc = 99, min(300, max(100, math.ceil(100 * reserved / peak))), 1
            while not fits(hi):
                lo = hi
                if hi >= 300:
                    hi = None
                    break
                hi, inc = min(300, hi + inc), inc * 2
            while hi is not None and hi - lo > 1:
                mid = (lo + hi) // 2
                if fits(mid):
                    hi = mid
                else:
                    lo = mid
            cap = peak * hi // 100 if hi else None
            report[key] = {"cap_bytes": cap, "percent": hi, "ratio": cap / peak if cap else None,
                           "uncapped_peak_reserved_bytes": reserved, "trials": trials}
    write_json(args.json, report)
    print()
    print("| allocator | peak allocated | uncapped peak reserved | smallest cap that completed "
          "| cap / peak allocated | trials |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key, label in [("default", "default"), ("expandable", "expandable_segments:True")]:
        r = report[key]
        cap = f"{r['cap_bytes'] / 2**30:.2f} GiB" if r["cap_bytes"] else "none up to 300 %"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        print(f"| {label} | {peak / 2**30:.2f} GiB | {r['uncapped_peak_reserved_bytes'] / 2**30:.2f} GiB "
              f"| {cap} | {ratio} | {len(r['trials'])} |")
    print(f"wrote {args.json}")


def cmd_compare(args):
    runs = []
    for path in (args.torch, args.rust):
        if not os.path.isfile(path):
            fail(f"file not found: {path}")
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data.get("losses"), list):
            fail(f"{path}: no \"losses\" list")
        runs.append([float(v) for v in data["losses"]])
    t, r = runs
    n = min(len(t), len(r))
    if n == 0:
        fail("no steps to compare")
    if len(t) != len(r):
        print(f"note: torch has {len(t)} losses, rust {len(r)}; comparing the first {n}")
    rel = [abs(r[i] - t[i]) / max(abs(t[i]), 1e-12) if math.isfinite(r[i]) else math.inf
           for i in range(n)]
    print(f"{'step':>5}  {'torch loss':>12}  {'rust loss':>12}  {'rel diff':>10}")
    for i in range(n):
        if i < 10 or i % 10 == 0 or i == n - 1:
            print(f"{i:5d}  {t[i]:12.6f}  {r[i]:12.6f}  {rel[i]:10.3e}")
    ok = True
    for label, k, tol in [(f"first {min(args.first, n)} steps", min(args.first, n), args.tol_first),
                          (f"all {n} steps", n, args.tol_all)]:
        worst = max(rel[:k])
        passed = worst <= tol
        ok &= passed
        print(f"max relative difference, {label}: {worst:.3e} (tolerance {tol:g}): "
              f"{'PASS' if passed else 'FAIL'}")
    sys.exit(0 if ok else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init", help="write the initial weights and batches")
    p.add_argument("--out", required=True, help="directory for gpt2_init.safetensors")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-batch", type=int, default=4)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=1024, help="capped at n_positions")
    p.add_argument("--tiny", action="store_true", help="tiny model for CPU checks")
    for name, hlp in [("train", "train and write losses, timing and memory"),
                      ("find-cap", "smallest memory cap that completes, per allocator")]:
        p = sub.add_parser(name, help=hlp)
        p.add_argument("--init", required=True, help="gpt2_init.safetensors written by init")
        p.add_argument("--precision", required=True, choices=["fp32", "bf16"])
        p.add_argument("--json", required=True, help="output JSON")
        p.add_argument("--steps", type=int, help="first N batches (default: all)")
        p.add_argument("--device", default="cuda")
        if name == "train":
            p.add_argument("--grads-out", help="safetensors file for step 0's grads (before clipping)")
            p.add_argument("--cap-bytes", type=int,
                           help="set_per_process_memory_fraction(min(1, B / total memory))")
            p.add_argument("--expandable", action="store_true",
                           help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    p = sub.add_parser("compare", help="compare torch and rust losses")
    p.add_argument("--torch", required=True)
    p.add_argument("--rust", required=True)
    p.add_argument("--first", type=int, default=10)
    p.add_argument("--tol-first", type=float, default=1e-4)
    p.add_argument("--tol-all", type=float, default=1e-2)
    args = ap.parse_args()
    if args.cmd == "train" and args.expandable:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # before torch loads
    {"init": cmd_init, "train": cmd_train, "find-cap": cmd_find_cap,
     "compare": cmd_compare}[args.cmd](args)


if __name__ == "__main__":
    main()
