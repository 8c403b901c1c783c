#!/usr/bin/env python3
"""Record a PyTorch CUDA allocation trace, and find the smallest memory cap.

Runs a named training (or inference) workload on one GPU with
``torch.cuda.memory._record_memory_history(enabled="all", context=None)`` and
writes the snapshot pickle that ``cuarena replay`` reads:

    python3 scripts/pytorch_trace.py resnet50-varbatch --steps 40 --out resnet50.pickle
    python3 scripts/pytorch_trace.py gpt2-varlen --steps 40 --out gpt2.pickle --find-cap

``scripts/record-traces.sh`` records several workloads, gzipped, into $OUT.

With ``--find-cap`` it also searches, in 1 % steps of the uncapped peak
allocated bytes, for the smallest ``torch.cuda.set_per_process_memory_fraction``
cap under which the run still completes, for the default caching allocator and
for ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Every trial runs in a
fresh subprocess (same seed, so the same batches), and a small table is printed.

``--device cpu`` runs a workload without recording anything: a check of this
script on a machine without a GPU (use few ``--steps``).

Workloads (synthetic data, fixed seed, no downloads: models are built from
configs with random weights; default --steps in brackets, each well under a
minute on one H100):
  resnet50-varbatch  [40] torchvision ResNet-50, SGD with momentum; batch sizes
                     from {8,16,32,48,64,96,128}, image sizes from
                     {160,192,224,256}; a 256-image evaluation pass every 10 steps.
  gpt2-varlen        [40] a small GPT-2-like decoder from torch.nn layers (6
                     layers, d_model 512, 8 heads, vocabulary 50257), AdamW;
                     batch sizes from {1,2,4,8,16}, sequence lengths from
                     {128,256,512,1024}.
  bert-varlen        [40] variable-shape fine-tuning of a BERT-base-like encoder
                     (12 layers, d_model 768, 12 heads, vocabulary 30522) for
                     two-class sequence classification, AdamW: transformers'
                     BertForSequenceClassification built from a BertConfig, or,
                     without transformers, torch.nn.TransformerEncoder layers of
                     the same shape. Sequence lengths from
                     {64,128,192,256,384,512}, batch sizes from {8,16,32,48,64}
                     with at most 16384 tokens a batch, each example padded to
                     the longest (attention mask) from a length of its own.
  model-switch       [48] two models taking turns in phases of 6 steps, as in a
                     hyper-parameter sweep or a multi-model server: torchvision
                     ResNet-18 (SGD with momentum; batch sizes from
                     {32,64,96,128}, 224x224 images) and a GPT-2-like decoder
                     (8 layers, d_model 768, 12 heads, vocabulary 50257, AdamW
                     with a learning rate drawn per phase; batch sizes from
                     {4,8,16}, sequence lengths from {128,256,512}). Between
                     phases the ResNet and its momentum buffers move to the CPU
                     and back, and the decoder and its AdamW state are deleted
                     and built anew, so large long-lived blocks come and go.
  llm-decode         [16] KV-cache inference with torch.no_grad(): transformers'
                     GPT2LMHeadModel from a GPT2Config (6 layers, d_model 768,
                     12 heads, 1024 positions, vocabulary 50257) in bfloat16;
                     each step is one request: batch size from {1,2,4,8,16} (1
                     twice as often), a random prompt of 16 to 768 tokens, then
                     8 to 128 new tokens decoded greedily one at a time with
                     the growing cache (logits of the last position only, as a
                     server computes them).
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


def sync(torch, device):
    """Waits for the device's work (nothing to wait for with --device cpu)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    sync(torch, device)


def gpt_decoder(torch, vocab, ctx, d, heads, layers):
    """A GPT-2-like decoder from torch.nn layers (built on the CPU); its forward gives logits."""
    nn = torch.nn

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

    return Gpt()


def lm_step(torch, model, opt, vocab, batch, seq, device):
    """One next-token training step on random tokens."""
    idx = torch.randint(0, vocab, (batch, seq + 1), device=device)
    opt.zero_grad(set_to_none=True)
    logits = model(idx[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), idx[:, 1:].reshape(-1))
    loss.backward()
    opt.step()


def gpt2_varlen(torch, steps, rng, device):
    vocab = 50257
    model = gpt_decoder(torch, vocab, ctx=1024, d=512, heads=8, layers=6).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(steps):
        batch = rng.choice([1, 2, 4, 8, 16])
        seq = rng.choice([128, 256, 512, 1024])
        lm_step(torch, model, opt, vocab, batch, seq, device)
    sync(torch, device)


def bert_varlen(torch, steps, rng, device):
    nn = torch.nn
    vocab, max_len, d, heads, layers = 30522, 512, 768, 12, 12
    try:
        from transformers import BertConfig, BertForSequenceClassification
    except ImportError:
        BertConfig = None
    if BertConfig is not None:
        config = BertConfig(
            vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
            num_attention_heads=heads, intermediate_size=4 * d,
            max_position_embeddings=max_len, num_labels=2)
        model = BertForSequenceClassification(config)

        def loss_of(ids, mask, labels):
            return model(input_ids=ids, attention_mask=mask, labels=labels).loss
    else:
        print("bert-varlen: no transformers; a torch.nn.TransformerEncoder of BERT-base's shape",
              file=sys.stderr)

        class BertLike(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(vocab, d)
                self.pos = nn.Embedding(max_len, d)
                self.seg = nn.Embedding(2, d)
                self.norm = nn.LayerNorm(d)
                self.drop = nn.Dropout(0.1)
                # Post-norm, as BERT.
                layer = nn.TransformerEncoderLayer(
                    d, heads, 4 * d, dropout=0.1, activation="gelu", batch_first=True)
                self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
                self.pool = nn.Linear(d, d)
                self.cls = nn.Linear(d, 2)

            def forward(self, ids, mask):
                pos = torch.arange(ids.shape[1], device=ids.device)
                h = self.tok(ids) + self.pos(pos) + self.seg(torch.zeros_like(ids))
                h = self.blocks(self.drop(self.norm(h)), src_key_padding_mask=mask == 0)
                return self.cls(self.drop(torch.tanh(self.pool(h[:, 0]))))

        model = BertLike()

        def loss_of(ids, mask, labels):
            return nn.functional.cross_entropy(model(ids, mask), labels)

    model.to(device)  # in place: loss_of's model is on the device too
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    for _ in range(steps):
        model.train()
        seq = rng.choice([64, 128, 192, 256, 384, 512])
        batch = rng.choice([b for b in (8, 16, 32, 48, 64) if b * seq <= 16384])
        # Padded to the longest example, as a collator does: that one has
        # length seq, the others lengths of their own.
        lengths = torch.tensor([seq] + [rng.randint(seq // 4, seq) for _ in range(batch - 1)])
        mask = (torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)).long()
        ids = torch.randint(1, vocab, (batch, seq)) * mask  # 0 is [PAD]
        labels = torch.randint(0, 2, (batch,))
        # The batch comes from the CPU, as from a data loader.
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(ids, mask, labels)
        loss.backward()
        opt.step()
        del ids, mask, labels, loss
    sync(torch, device)


def model_switch(torch, steps, rng, device):
    try:
        import torchvision
    except ImportError:
        sys.exit("model-switch needs torchvision (pip install torchvision)")
    vocab, phase_steps = 50257, 6
    cpu = torch.device("cpu")

    def move_optimizer_state(opt, to):
        # As Optimizer.load_state_dict places state: with the parameters,
        # except the step counters.
        for state in opt.state.values():
            for key, value in state.items():
                if key != "step" and torch.is_tensor(value):
                    state[key] = value.to(to)

    resnet = torchvision.models.resnet18(num_classes=1000).to(device)
    resnet_opt = torch.optim.SGD(resnet.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    lm = lm_opt = None
    for step in range(steps):
        phase, k = divmod(step, phase_steps)
        vision = phase % 2 == 0
        if k == 0 and step > 0:
            if vision:
                # The decoder's trial is over: it and its AdamW state go,
                # and the ResNet comes back where it left off.
                lm = lm_opt = None
                gc.collect()
                resnet.to(device)  # moves the parameters in place: the optimizer keeps them
                move_optimizer_state(resnet_opt, device)
            else:
                # The ResNet waits on the CPU with its momentum; a new
                # decoder, with a learning rate of its own, is built.
                resnet_opt.zero_grad(set_to_none=True)
                resnet.to(cpu)
                move_optimizer_state(resnet_opt, cpu)
                lm = gpt_decoder(torch, vocab, ctx=512, d=768, heads=12, layers=8).to(device)
                lm_opt = torch.optim.AdamW(lm.parameters(), lr=rng.choice([1e-4, 3e-4, 6e-4]))
        if vision:
            resnet.train()
            batch = rng.choice([32, 64, 96, 128])
            x = torch.randn(batch, 3, 224, 224, device=device)
            y = torch.randint(0, 1000, (batch,), device=device)
            resnet_opt.zero_grad(set_to_none=True)
            loss = loss_fn(resnet(x), y)
            loss.backward()
            resnet_opt.step()
            del x, y, loss
        else:
            lm.train()
            lm_step(torch, lm, lm_opt, vocab, rng.choice([4, 8, 16]), rng.choice([128, 256, 512]),
                    device)
    sync(torch, device)


def llm_decode(torch, steps, rng, device):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        sys.exit("llm-decode needs transformers (pip install transformers)")
    config = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=6, n_head=12)
    model = GPT2LMHeadModel(config).to(device=device, dtype=torch.bfloat16).eval()
    body, head = model.transformer, model.lm_head
    with torch.no_grad():
        for _ in range(steps):  # one request a step
            batch = rng.choice([1, 1, 2, 4, 8, 16])
            prompt = rng.randint(16, 768)
            new = rng.randint(8, 128)  # prompt + new <= 896 < n_positions
            ids = torch.randint(0, config.vocab_size, (batch, prompt), device=device)
            # The body, then the head on the last position alone (as a
            # server does: no logits for the whole prompt). The cache (a
            # DynamicCache, or tuples in older transformers) grows a token a
            # step and is passed back in.
            out = body(input_ids=ids, use_cache=True)
            tokens = [head(out.last_hidden_state[:, -1:]).argmax(-1)]
            for _ in range(new - 1):
                out = body(input_ids=tokens[-1], past_key_values=out.past_key_values,
                           use_cache=True)
                tokens.append(head(out.last_hidden_state[:, -1:]).argmax(-1))
            answer = torch.cat(tokens, dim=1)
            assert answer.shape == (batch, new)
            del ids, out, tokens, answer
    sync(torch, device)


# name: (workload, default --steps)
WORKLOADS = {
    "resnet50-varbatch": (resnet50_varbatch, 40),
    "gpt2-varlen": (gpt2_varlen, 40),
    "bert-varlen": (bert_varlen, 40),
    "model-switch": (model_switch, 48),
    "llm-decode": (llm_decode, 16),
}


def run_workload(args, record):
    """Runs the workload once; returns peak allocated/reserved bytes (None
    off CUDA, where nothing is recorded)."""
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("no CUDA device")
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    if args.cap_bytes:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_bytes / total), device)
    record = record and cuda
    if record:
        # From the very start, so model weights are in the trace too.
        torch.cuda.memory._record_memory_history(enabled="all", context=None)
    # Everything the workload allocates is local to it, so it is all freed
    # (and recorded as freed) before the snapshot is written.
    WORKLOADS[args.workload][0](torch, args.steps, rng, device)
    gc.collect()
    sync(torch, device)
    if not cuda:
        return None
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
    ap.add_argument("--steps", type=int,
                    help="training steps (llm-decode: requests); default per workload, above")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda:0",
                    help="default cuda:0; cpu runs the workload without recording (a check)")
    ap.add_argument("--out", help="snapshot pickle to write (default WORKLOAD.pickle)")
    ap.add_argument("--find-cap", action="store_true",
                    help="search for the smallest memory cap that completes")
    ap.add_argument("--cap-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps is None:
        args.steps = WORKLOADS[args.workload][1]
    if args.find_cap and not args.device.startswith("cuda"):
        ap.error("--find-cap needs a CUDA device")

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
    if stats is None:
        print(f"ran {args.workload} for {args.steps} steps on {args.device}; nothing recorded "
              "(traces need a CUDA device)")
        return
    print(f"wrote {args.out}")
    print(f"peak allocated {stats['peak_allocated']:,} B ({stats['peak_allocated'] / 2**30:.2f} GiB), "
          f"peak reserved {stats['peak_reserved']:,} B ({stats['peak_reserved'] / 2**30:.2f} GiB)")
    if args.find_cap:
        find_cap(args)


if __name__ == "__main__":
    main()
