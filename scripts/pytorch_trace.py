#!/usr/bin/env python3
"""Record a PyTorch CUDA allocation trace, and find the smallest memory cap.

Runs a named training (or inference) workload on one GPU with
``torch.cuda.memory._record_memory_history(enabled="all", context=None)`` and
writes the snapshot pickle that ``cuarena replay`` reads:

    python3 scripts/pytorch_trace.py resnet50-varbatch --steps 40 --out resnet50.pickle
    python3 scripts/pytorch_trace.py gpt2-varlen --steps 40 --out gpt2.pickle --find-cap
    python3 scripts/pytorch_trace.py moe-train --seed 1 --out moe-train_s1.pickle.gz --stats-json moe.json

``scripts/record-traces.sh`` records several workloads, gzipped, into $OUT;
``scripts/record-corpus.sh`` records the snapshot-reader fixtures and the whole
corpus (``--fixtures DIR`` and ``--corpus DIR`` below).

With ``--find-cap`` it also searches, in 1 % steps of the uncapped peak
allocated bytes, for the smallest ``torch.cuda.set_per_process_memory_fraction``
cap under which the run still completes, for the default caching allocator and
for ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Every trial runs in a
fresh subprocess (same seed, so the same batches), and a small table is printed.

``--device cpu`` runs a workload without recording anything: a check of this
script on a machine without a GPU (use few ``--steps``).

Recording options (each off by default, so the default trace is as before):
  --stacks             record Python stacks too (context="all", stacks="python")
  --max-entries N      keep only the last N trace entries (PyTorch's ring buffer)
  --after-load         start recording only after the model (and optimizer) is
                       built and one warm-up step ran, just before the second
                       step: what was allocated before then shows up in the
                       snapshot's ``segments`` only (``--steps 2`` gives a
                       one-step snapshot)
  --dump-live          write the snapshot at the end of the last step, while the
                       workload's model, optimizer state and caches are still
                       alive (default: after the workload returned and
                       everything was freed)
  --empty-cache-every K  call torch.cuda.empty_cache() before every K-th step
  --expandable         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set
                       before torch initialises CUDA)
  --cap-bytes B        torch.cuda.set_per_process_memory_fraction(B / total)
  --short-paths        shorten the source file names in recorded stack frames
                       (from ``site-packages/`` on, and this script as
                       ``scripts/pytorch_trace.py``); nothing else changes
  --stats-json FILE    write what PyTorch reported at the dump (peak
                       allocated/reserved, device, torch version) and facts
                       computed from the snapshot (events per action, active
                       blocks, segment sizes) as JSON
An ``--out`` that ends in ``.gz`` is written gzipped.

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
  gpt2-varlen-amp    [40] the same under bfloat16 autocast.
  bert-varlen        [40] variable-shape fine-tuning of a BERT-base-like encoder
                     (12 layers, d_model 768, 12 heads, vocabulary 30522) for
                     two-class sequence classification, AdamW: transformers'
                     BertForSequenceClassification built from a BertConfig, or,
                     without transformers, torch.nn.TransformerEncoder layers of
                     the same shape. Sequence lengths from
                     {64,128,192,256,384,512}, batch sizes from {8,16,32,48,64}
                     with at most 16384 tokens a batch, each example padded to
                     the longest (attention mask) from a length of its own.
  bert-varlen-amp    [40] the same under bfloat16 autocast.
  bert-infer         [60] inference requests to a BERT-base encoder
                     (transformers' BertModel, float32, torch.no_grad()):
                     batch 1 to 64, sequence length 16 to 512 (at most 16384
                     tokens a request), padded with an attention mask; the
                     pooled output goes back to the CPU.
  bert-infer-bf16    [60] the same with the model in bfloat16.
  t5-varlen-amp      [30] an encoder-decoder (transformers'
                     T5ForConditionalGeneration from a T5Config: 6+6 layers,
                     d_model 512, 8 heads) trained under bfloat16 autocast with
                     AdamW; source lengths 32 to 512, target lengths 8 to 128,
                     batch 4 to 32 (at most 8192 source tokens a batch).
  moe-train          [30] a mixture-of-experts decoder (4 layers, d_model 512,
                     8 experts of width 1024, top-2 routing, load-balancing
                     loss), AdamW: each expert gets a different, changing
                     number of tokens; batch from {4,8,16}, sequence lengths
                     from {128,256,512}.
  moe-train-amp      [30] the same under bfloat16 autocast.
  llm-decode         [16] KV-cache inference with torch.no_grad(): transformers'
                     GPT2LMHeadModel from a GPT2Config (6 layers, d_model 768,
                     12 heads, 1024 positions, vocabulary 50257) in bfloat16;
                     each step is one request: batch size from {1,2,4,8,16} (1
                     twice as often), a random prompt of 16 to 768 tokens, then
                     8 to 128 new tokens decoded greedily one at a time with
                     the growing cache (logits of the last position only, as a
                     server computes them).
  llama-serve        [32] continuous batching, as an LLM server does it: a
                     Llama-like decoder from torch.nn layers (8 layers, d_model
                     1024, 16 query heads, 4 key/value heads, SwiGLU, bfloat16)
                     serves --steps requests (prompts of 16 to 512 tokens, 8 to
                     128 new tokens) with at most 8 in flight; a new request is
                     prefilled alone and its KV cache joins the batch's (left
                     padding, concatenation); every tick decodes one token for
                     all requests in flight; a finished request's rows leave the
                     cache (index_select, then the all-padding columns are cut).
  llm-serve-hf       [12] interleaved requests to transformers' LlamaForCausalLM
                     (from a LlamaConfig: 8 layers, d_model 1024, 16 heads, 4
                     key/value heads, bfloat16), each with its own DynamicCache:
                     at most 4 requests in flight (batch 1, 2 or 4; prompts of
                     16 to 1024 tokens, 8 to 80 new tokens), decoded a token at
                     a time in turn, so KV caches of different lengths grow side
                     by side.
  convnext-varres-amp [24] torchvision ConvNeXt-T classification under bfloat16
                     autocast, AdamW; resolutions 128 to 320, batch 16 to 64 (at
                     most 64 images of 224x224 worth of pixels); a 128-image
                     evaluation pass every 8 steps and at the end.
  effnet-varres      [24] torchvision EfficientNet-B0 classification, float32,
                     SGD with momentum; resolutions 160 to 384, batch 16 to 96
                     (at most 96 images of 224x224 worth of pixels).
  deeplab-varres     [16] torchvision DeepLabV3-ResNet50 segmentation (weights
                     and backbone weights None, 21 classes, auxiliary head), SGD
                     with momentum; batch 2 to 8 of images of height and width
                     from {256,320,384,448,512} (at most 8 of 384x384 worth of
                     pixels); a 2-image 512x768 evaluation pass every 8 steps
                     and at the end.
  fcn-varres-amp     [16] torchvision FCN-ResNet50 the same way, under bfloat16
                     autocast.
  fasterrcnn-varres  [18] torchvision Faster R-CNN MobileNetV3-Large FPN
                     detection (weights and backbone weights None, 91 classes,
                     resized to a shorter side drawn from 320 to 640), SGD;
                     2 to 8 images a batch, each of its own size (240 to 720
                     pixels a side) with 1 to 12 random boxes; a 4-image
                     evaluation pass every 6 steps and at the end.
  retinanet-varres   [12] torchvision RetinaNet-ResNet50 FPN the same way
                     (shorter side 384 to 576, 2 or 4 images a batch).
  unet-diffusion     [30] a diffusion model's training: a UNet from torch.nn
                     layers (channels 64/128/256, two residual blocks a level,
                     self-attention at the lowest level, sinusoidal timestep
                     embedding), noise prediction at a random timestep, AdamW
                     and an EMA copy of the weights; resolutions from
                     {32,48,64,96,128}, batch 8 to 64 (at most 16 of 128x128
                     worth of pixels).
  unet-diffusion-amp [30] the same under bfloat16 autocast.
  unet-sample        [8] that UNet (bfloat16, no_grad) sampling: each request
                     a batch of 1 to 16 at a resolution of its own, 20
                     denoising steps with classifier-free guidance (the batch
                     doubled).
  multi-model-serve  [30] an inference server of three bfloat16 models
                     (BERT-base encoder, ResNet-50, the UNet) with room for two
                     on the GPU: each request names a model; a missing one is
                     moved in and the least recently used one out to the CPU
                     (then torch.cuda.empty_cache()), and the request runs at a
                     batch of its own.
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
  tiny-gpt           [6] a tiny decoder (2 layers, d_model 256, 4 heads,
                     vocabulary 8192), AdamW; batch from {2,4,8}, sequence
                     lengths from {64,128,256}: small snapshots for tests.
  notebook-oom       [3] a notebook-like session under a 2 GiB cap (unless
                     --cap-bytes): a small MLP is trained for --steps steps;
                     then a fragmented 768 MiB segment (every other 48 MiB
                     block freed) makes a request that fits the free bytes fail
                     (torch.cuda.OutOfMemoryError, caught), a request larger
                     than the cap fails too (caught), the blocks are freed, the
                     first request now succeeds, and two more steps run.

Drivers (run on a CUDA machine; each job is a subprocess of this script):
  --fixtures DIR       small snapshots for the snapshot reader's tests, each
                       with a JSON of facts (see FIXTURES below)
  --corpus DIR         the corpus of gzipped snapshots (see CORPUS below) and
                       DIR/manifest.json
  --settings DIR       corpus traces (--only) under the default allocator
                       settings and under other PYTORCH_CUDA_ALLOC_CONF values
                       (see SETTINGS_RUNS below), for the allocator model's
                       what-if check; --tags exp,ms128 records only those
                       settings (`default` for the default run)
  --jobs N (4), --deadline S (420: no job starts later), --job-timeout S (180),
  --budget-gib G (0.85 of the GPU: estimated GiB in flight at once)
"""

import argparse
import collections
import contextlib
import gc
import gzip
import json
import math
import os
import pickle
import random
import shutil
import subprocess
import sys
import time

EXIT_OOM = 3
GiB = 1 << 30
MiB = 1 << 20


def sync(torch, device):
    """Waits for the device's work (nothing to wait for with --device cpu)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(torch, device, amp):
    """bfloat16 autocast when amp, else nothing."""
    if amp:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Recorder:
    """Carries out --after-load, --dump-live and --empty-cache-every: each
    workload calls step() at the top of every step and end() at the end of
    its last step, while its tensors are still alive. Without those options
    both do nothing."""

    def __init__(self):
        self.args = None
        self.torch = None
        self.device = None
        self.steps_seen = 0
        self.recording = False
        self.dump_stats = None  # set once the snapshot is written

    def setup(self, args, torch, device, record):
        self.args, self.torch, self.device = args, torch, device
        self.record = record

    def start(self):
        kw = {"enabled": "all"}
        if self.args.stacks:
            kw.update(context="all", stacks="python")
        else:
            kw.update(context=None)
        if self.args.max_entries:
            kw["max_entries"] = self.args.max_entries
        self.torch.cuda.memory._record_memory_history(**kw)
        self.recording = True

    def step(self):
        if self.args is None:
            return
        self.steps_seen += 1
        every = self.args.empty_cache_every
        if every and self.device.type == "cuda" and self.steps_seen > 1 \
                and (self.steps_seen - 1) % every == 0:
            self.torch.cuda.empty_cache()
        if self.record and self.args.after_load and self.steps_seen == 2 and not self.recording:
            sync(self.torch, self.device)
            self.start()

    def end(self):
        if self.args is not None and self.record and self.args.dump_live and self.recording:
            self.dump()

    def dump(self):
        torch, device = self.torch, self.device
        sync(torch, device)
        self.dump_stats = {
            "peak_allocated": torch.cuda.max_memory_allocated(device),
            "peak_reserved": torch.cuda.max_memory_reserved(device),
            "allocated_at_dump": torch.cuda.memory_allocated(device),
            "reserved_at_dump": torch.cuda.memory_reserved(device),
        }
        torch.cuda.memory._dump_snapshot(raw_out(self.args.out))
        torch.cuda.memory._record_memory_history(enabled=None)
        self.recording = False


REC = Recorder()


def raw_out(out):
    """The pickle _dump_snapshot writes (gzipped afterwards for a .gz --out)."""
    return out[:-3] if out.endswith(".gz") else out


# ---------------------------------------------------------------- vision

def resnet50_varbatch(torch, steps, rng, device):
    try:
        import torchvision
    except ImportError:
        sys.exit("resnet50-varbatch needs torchvision (pip install torchvision)")
    model = torchvision.models.resnet50(num_classes=1000).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(steps):
        REC.step()
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
    REC.end()
    sync(torch, device)


def need_torchvision(name):
    try:
        import torchvision
    except ImportError:
        sys.exit(f"{name} needs torchvision (pip install torchvision)")
    return torchvision


def classify_varres(torch, steps, rng, device, model, opt, amp, sizes, batches, max_pixels,
                    eval_every, eval_batch):
    """Classification training at a resolution and batch size drawn per step."""
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(steps):
        REC.step()
        model.train()
        size = rng.choice(sizes)
        batch = rng.choice([b for b in batches if b * size * size <= max_pixels] or [batches[0]])
        x = torch.randn(batch, 3, size, size, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        opt.zero_grad(set_to_none=True)
        with autocast(torch, device, amp):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        del x, y, loss
        if eval_every and ((step + 1) % eval_every == 0 or step == steps - 1):
            model.eval()
            with torch.no_grad(), autocast(torch, device, amp):
                x = torch.randn(eval_batch, 3, 224, 224, device=device)
                model(x).float().softmax(-1).cpu()
                del x
    REC.end()
    sync(torch, device)


def convnext_varres_amp(torch, steps, rng, device):
    tv = need_torchvision("convnext-varres-amp")
    model = tv.models.convnext_tiny(weights=None, num_classes=1000).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    classify_varres(torch, steps, rng, device, model, opt, True,
                    sizes=[128, 160, 192, 224, 256, 288, 320], batches=[16, 32, 48, 64],
                    max_pixels=64 * 224 * 224, eval_every=8, eval_batch=128)


def effnet_varres(torch, steps, rng, device):
    tv = need_torchvision("effnet-varres")
    model = tv.models.efficientnet_b0(weights=None, num_classes=1000).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-5)
    classify_varres(torch, steps, rng, device, model, opt, False,
                    sizes=[160, 192, 224, 256, 288, 320, 384], batches=[16, 32, 48, 64, 96],
                    max_pixels=96 * 224 * 224, eval_every=0, eval_batch=0)


def segment_varres(torch, steps, rng, device, model, amp):
    """Segmentation training on images of a height and width drawn per step."""
    F = torch.nn.functional
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    sides = [256, 320, 384, 448, 512]
    for step in range(steps):
        REC.step()
        model.train()
        h, w = rng.choice(sides), rng.choice(sides)
        batch = rng.choice([b for b in (2, 4, 6, 8) if b * h * w <= 8 * 384 * 384])
        x = torch.randn(batch, 3, h, w, device=device)
        y = torch.randint(0, 21, (batch, h, w), device=device)
        y[:, : h // 16] = 255  # an ignored border, as in VOC's masks
        opt.zero_grad(set_to_none=True)
        with autocast(torch, device, amp):
            out = model(x)
            loss = F.cross_entropy(out["out"], y, ignore_index=255) \
                + 0.5 * F.cross_entropy(out["aux"], y, ignore_index=255)
        loss.backward()
        opt.step()
        del x, y, out, loss
        if (step + 1) % 8 == 0 or step == steps - 1:
            model.eval()
            with torch.no_grad(), autocast(torch, device, amp):
                x = torch.randn(2, 3, 512, 768, device=device)
                model(x)["out"].argmax(1).cpu()
                del x
    REC.end()
    sync(torch, device)


def deeplab_varres(torch, steps, rng, device):
    tv = need_torchvision("deeplab-varres")
    model = tv.models.segmentation.deeplabv3_resnet50(
        weights=None, weights_backbone=None, num_classes=21, aux_loss=True).to(device)
    segment_varres(torch, steps, rng, device, model, amp=False)


def fcn_varres_amp(torch, steps, rng, device):
    tv = need_torchvision("fcn-varres-amp")
    model = tv.models.segmentation.fcn_resnet50(
        weights=None, weights_backbone=None, num_classes=21, aux_loss=True).to(device)
    segment_varres(torch, steps, rng, device, model, amp=True)


def random_detection_batch(torch, rng, device, n, lo, hi):
    """n images, each of a size of its own, with 1 to 12 random boxes each."""
    images, targets = [], []
    for _ in range(n):
        h, w = rng.randint(lo, hi), rng.randint(lo, hi)
        images.append(torch.rand(3, h, w, device=device))
        k = rng.randint(1, 12)
        x1 = torch.rand(k) * w * 0.7
        y1 = torch.rand(k) * h * 0.7
        bw = 8 + torch.rand(k) * (w - x1 - 8).clamp(min=1)
        bh = 8 + torch.rand(k) * (h - y1 - 8).clamp(min=1)
        boxes = torch.stack([x1, y1, (x1 + bw).clamp(max=w), (y1 + bh).clamp(max=h)], dim=1)
        targets.append({"boxes": boxes.to(device),
                        "labels": torch.randint(1, 91, (k,)).to(device)})
    return images, targets


def detect_varres(torch, steps, rng, device, model, batches, eval_every):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
    for step in range(steps):
        REC.step()
        model.train()
        images, targets = random_detection_batch(torch, rng, device, rng.choice(batches), 240, 720)
        opt.zero_grad(set_to_none=True)
        losses = model(images, targets)
        loss = sum(losses.values())
        loss.backward()
        opt.step()
        del images, targets, losses, loss
        if (step + 1) % eval_every == 0 or step == steps - 1:
            model.eval()
            with torch.no_grad():
                images, _ = random_detection_batch(torch, rng, device, 4, 240, 720)
                detections = model(images)
                [{k: v.cpu() for k, v in d.items()} for d in detections]
                del images, detections
    REC.end()
    sync(torch, device)


def fasterrcnn_varres(torch, steps, rng, device):
    tv = need_torchvision("fasterrcnn-varres")
    model = tv.models.detection.fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=91,
        min_size=(320, 384, 448, 512, 576, 640), max_size=1024).to(device)
    detect_varres(torch, steps, rng, device, model, batches=[2, 4, 8], eval_every=6)


def retinanet_varres(torch, steps, rng, device):
    tv = need_torchvision("retinanet-varres")
    model = tv.models.detection.retinanet_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=91,
        min_size=(384, 448, 512, 576), max_size=896).to(device)
    detect_varres(torch, steps, rng, device, model, batches=[2, 4], eval_every=6)


# ---------------------------------------------------------------- diffusion

def unet_model(torch, ch=64, mults=(1, 2, 4), nres=2, tdim=256):
    """A small diffusion UNet from torch.nn layers (built on the CPU):
    forward(x, t) predicts the noise; heights and widths divisible by 4."""
    nn, F = torch.nn, torch.nn.functional

    def timestep_embedding(t, dim):
        half = dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]
        return torch.cat([args.sin(), args.cos()], dim=1)

    class ResBlock(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.n1 = nn.GroupNorm(32, cin)
            self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
            self.t = nn.Linear(tdim, cout)
            self.n2 = nn.GroupNorm(32, cout)
            self.drop = nn.Dropout(0.1)
            self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, temb):
            h = self.c1(F.silu(self.n1(x)))
            h = h + self.t(F.silu(temb))[:, :, None, None]
            h = self.c2(self.drop(F.silu(self.n2(h))))
            return h + self.skip(x)

    class Attention(nn.Module):
        def __init__(self, c, heads=4):
            super().__init__()
            self.heads = heads
            self.norm = nn.GroupNorm(32, c)
            self.qkv = nn.Conv2d(c, 3 * c, 1)
            self.proj = nn.Conv2d(c, c, 1)

        def forward(self, x):
            b, c, h, w = x.shape
            q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w) \
                .permute(1, 0, 2, 4, 3).unbind(0)
            a = F.scaled_dot_product_attention(q, k, v)
            return x + self.proj(a.transpose(2, 3).reshape(b, c, h, w))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.temb = nn.Sequential(nn.Linear(ch, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
            self.inp = nn.Conv2d(3, ch, 3, padding=1)
            self.down = nn.ModuleList()
            chans, c = [ch], ch
            for i, m in enumerate(mults):
                for _ in range(nres):
                    self.down.append(ResBlock(c, ch * m))
                    c = ch * m
                    chans.append(c)
                if i < len(mults) - 1:
                    self.down.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
                    chans.append(c)
            self.mid1, self.mid_attn, self.mid2 = ResBlock(c, c), Attention(c), ResBlock(c, c)
            self.up = nn.ModuleList()
            for i, m in reversed(list(enumerate(mults))):
                for _ in range(nres + 1):
                    self.up.append(ResBlock(c + chans.pop(), ch * m))
                    c = ch * m
                if i > 0:
                    self.up.append(nn.Upsample(scale_factor=2, mode="nearest"))
                    self.up.append(nn.Conv2d(c, c, 3, padding=1))
            self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

        def forward(self, x, t):
            temb = self.temb(timestep_embedding(t, ch).to(x.dtype))
            h = self.inp(x)
            skips = [h]
            for layer in self.down:
                h = layer(h, temb) if isinstance(layer, ResBlock) else layer(h)
                skips.append(h)
            h = self.mid2(self.mid_attn(self.mid1(h, temb)), temb)
            for layer in self.up:
                if isinstance(layer, ResBlock):
                    h = layer(torch.cat([h, skips.pop()], dim=1), temb)
                else:
                    h = layer(h)
            return self.out(h)

    return UNet()


def diffusion_schedule(torch, device, n=1000):
    betas = torch.linspace(1e-4, 0.02, n, device=device)
    return torch.cumprod(1 - betas, dim=0)


def unet_diffusion(torch, steps, rng, device, amp=False):
    model = unet_model(torch).to(device)
    ema = unet_model(torch).to(device)
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
    alpha_bar = diffusion_schedule(torch, device)
    for _ in range(steps):
        REC.step()
        model.train()
        res = rng.choice([32, 48, 64, 96, 128])
        batch = rng.choice([b for b in (8, 16, 32, 48, 64) if b * res * res <= 16 * 128 * 128])
        x0 = torch.randn(batch, 3, res, res, device=device)
        t = torch.randint(0, alpha_bar.numel(), (batch,), device=device)
        noise = torch.randn_like(x0)
        ab = alpha_bar[t][:, None, None, None]
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
        opt.zero_grad(set_to_none=True)
        with autocast(torch, device, amp):
            loss = torch.nn.functional.mse_loss(model(xt, t).float(), noise)
        loss.backward()
        opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.001)
        del x0, t, noise, ab, xt, loss
    REC.end()
    sync(torch, device)


def unet_sample(torch, steps, rng, device):
    model = unet_model(torch).to(device=device, dtype=torch.bfloat16).eval()
    alpha_bar = diffusion_schedule(torch, device)
    n = 20
    with torch.no_grad():
        for _ in range(steps):  # one request a step
            REC.step()
            res = rng.choice([32, 48, 64, 96, 128])
            batch = rng.choice([b for b in (1, 2, 4, 8, 16) if b * res * res <= 16 * 128 * 128])
            x = torch.randn(batch, 3, res, res, device=device)
            ts = torch.linspace(alpha_bar.numel() - 1, 0, n).long().tolist()
            for i, t in enumerate(ts):
                # Classifier-free guidance: conditional and unconditional
                # halves in one batch.
                tt = torch.full((2 * batch,), t, device=device)
                eps_c, eps_u = model(torch.cat([x, x]).bfloat16(), tt).float().chunk(2)
                eps = eps_u + 3.0 * (eps_c - eps_u)
                ab = alpha_bar[t]
                ab_prev = alpha_bar[ts[i + 1]] if i + 1 < n else torch.ones((), device=device)
                x0 = (x - (1 - ab).sqrt() * eps) / ab.sqrt()
                x = ab_prev.sqrt() * x0 + (1 - ab_prev).sqrt() * eps  # DDIM, eta 0
                del tt, eps_c, eps_u, eps, x0
            x.clamp(-1, 1).cpu()
            del x
        REC.end()
    sync(torch, device)


# ---------------------------------------------------------------- language

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


def lm_step(torch, model, opt, vocab, batch, seq, device, amp=False):
    """One next-token training step on random tokens."""
    idx = torch.randint(0, vocab, (batch, seq + 1), device=device)
    opt.zero_grad(set_to_none=True)
    with autocast(torch, device, amp):
        logits = model(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, vocab).float() if amp else logits.reshape(-1, vocab),
            idx[:, 1:].reshape(-1))
    loss.backward()
    opt.step()


def gpt2_varlen(torch, steps, rng, device, amp=False):
    vocab = 50257
    model = gpt_decoder(torch, vocab, ctx=1024, d=512, heads=8, layers=6).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(steps):
        REC.step()
        batch = rng.choice([1, 2, 4, 8, 16])
        seq = rng.choice([128, 256, 512, 1024])
        lm_step(torch, model, opt, vocab, batch, seq, device, amp)
    REC.end()
    sync(torch, device)


def tiny_gpt(torch, steps, rng, device):
    vocab = 8192
    model = gpt_decoder(torch, vocab, ctx=256, d=256, heads=4, layers=2).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(steps):
        REC.step()
        lm_step(torch, model, opt, vocab, rng.choice([2, 4, 8]), rng.choice([64, 128, 256]), device)
    REC.end()
    sync(torch, device)


def bert_varlen(torch, steps, rng, device, amp=False):
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
        REC.step()
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
        with autocast(torch, device, amp):
            loss = loss_of(ids, mask, labels)
        loss.backward()
        opt.step()
        del ids, mask, labels, loss
    REC.end()
    sync(torch, device)


def need_transformers(name):
    try:
        import transformers
    except ImportError:
        sys.exit(f"{name} needs transformers (pip install transformers)")
    return transformers


def bert_base_model(transformers):
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512)
    return transformers.BertModel(config), config


def bert_request(torch, rng, device, vocab):
    """A padded batch of 1 to 64 texts of 16 to 512 tokens (at most 16384)."""
    seq = rng.randint(16, 512)
    batch = rng.choice([b for b in (1, 1, 2, 4, 8, 16, 32, 64) if b * seq <= 16384])
    lengths = torch.tensor([seq] + [rng.randint(min(8, seq), seq) for _ in range(batch - 1)])
    mask = (torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)).long()
    ids = torch.randint(1, vocab, (batch, seq)) * mask
    return ids.to(device), mask.to(device)


def bert_infer(torch, steps, rng, device, dtype=None):
    tf = need_transformers("bert-infer")
    model, config = bert_base_model(tf)
    model = model.to(device=device, dtype=dtype or torch.float32).eval()
    with torch.no_grad():
        for _ in range(steps):  # one request a step
            REC.step()
            ids, mask = bert_request(torch, rng, device, config.vocab_size)
            out = model(input_ids=ids, attention_mask=mask)
            out.pooler_output.float().cpu()
            del ids, mask, out
        REC.end()
    sync(torch, device)


def t5_varlen_amp(torch, steps, rng, device):
    tf = need_transformers("t5-varlen-amp")
    config = tf.T5Config(
        vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6,
        num_heads=8, pad_token_id=0, decoder_start_token_id=0, eos_token_id=1)
    model = tf.T5ForConditionalGeneration(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(steps):
        REC.step()
        model.train()
        src = rng.randint(32, 512)
        tgt = rng.randint(8, 128)
        batch = rng.choice([b for b in (4, 8, 16, 32) if b * src <= 8192])
        lengths = torch.tensor([src] + [rng.randint(src // 4, src) for _ in range(batch - 1)])
        mask = (torch.arange(src).unsqueeze(0) < lengths.unsqueeze(1)).long()
        ids = torch.randint(2, config.vocab_size, (batch, src)) * mask
        labels = torch.randint(2, config.vocab_size, (batch, tgt))
        labels[:, rng.randint(4, tgt):] = -100  # padded targets
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        opt.zero_grad(set_to_none=True)
        with autocast(torch, device, True):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        del ids, mask, labels, loss
    REC.end()
    sync(torch, device)


def moe_decoder(torch, vocab, ctx, d, heads, layers, experts, width, top_k):
    """A decoder whose feed-forward layers are top-k routed mixtures of experts;
    forward gives (logits, load-balancing loss)."""
    nn, F = torch.nn, torch.nn.functional

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(d, experts, bias=False)
            self.experts = nn.ModuleList(
                nn.Sequential(nn.Linear(d, width), nn.GELU(), nn.Linear(width, d))
                for _ in range(experts))

        def forward(self, x):
            shape = x.shape
            x = x.reshape(-1, d)
            probs = self.router(x).float().softmax(-1)
            weight, chosen = probs.topk(top_k, dim=-1)
            weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                rows, slot = (chosen == e).nonzero(as_tuple=True)
                if rows.numel() == 0:
                    continue
                y = expert(x[rows]) * weight[rows, slot, None]
                out.index_add_(0, rows, y.to(out.dtype))
            share = F.one_hot(chosen[:, 0], experts).float().mean(0)
            aux = experts * (share * probs.mean(0)).sum()
            return out.reshape(shape), aux

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
            self.moe = MoE()

        def forward(self, x, mask):
            h = self.n1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
            y, aux = self.moe(self.n2(x))
            return x + y, aux

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            t = idx.shape[1]
            mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
            h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            aux = 0.0
            for block in self.blocks:
                h, a = block(h, mask)
                aux = aux + a
            return self.head(self.norm(h)), aux

    return Model()


def moe_train(torch, steps, rng, device, amp=False):
    vocab = 32000
    model = moe_decoder(torch, vocab, ctx=512, d=512, heads=8, layers=4, experts=8,
                        width=1024, top_k=2).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(steps):
        REC.step()
        batch, seq = rng.choice([4, 8, 16]), rng.choice([128, 256, 512])
        idx = torch.randint(0, vocab, (batch, seq + 1), device=device)
        opt.zero_grad(set_to_none=True)
        with autocast(torch, device, amp):
            logits, aux = model(idx[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, vocab).float(), idx[:, 1:].reshape(-1)) + 0.01 * aux
        loss.backward()
        opt.step()
        del idx, logits, aux, loss
    REC.end()
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
        REC.step()
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
    REC.end()
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
            REC.step()
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
        REC.end()
    sync(torch, device)


def llama_like(torch, vocab, max_pos, d, heads, kv_heads, layers, ffn):
    """A Llama-like decoder from torch.nn layers (RMSNorm, grouped-query
    attention, SwiGLU; learned positions). forward(ids, pos, caches, mask)
    gives the last position's logits and the layers' (key, value) caches."""
    nn, F = torch.nn, torch.nn.functional
    dh = d // heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
            self.q = nn.Linear(d, d, bias=False)
            self.kv = nn.Linear(d, 2 * kv_heads * dh, bias=False)
            self.o = nn.Linear(d, d, bias=False)
            self.up = nn.Linear(d, 2 * ffn, bias=False)
            self.down = nn.Linear(ffn, d, bias=False)

        def forward(self, x, cache, mask):
            b, t, _ = x.shape
            h = self.n1(x)
            q = self.q(h).view(b, t, heads, dh).transpose(1, 2)
            k, v = self.kv(h).view(b, t, 2, kv_heads, dh).permute(2, 0, 3, 1, 4).unbind(0)
            if cache is not None:
                k = torch.cat([cache[0], k], dim=2)
                v = torch.cat([cache[1], v], dim=2)
            else:
                k, v = k.contiguous(), v.contiguous()
            if mask is None:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
            g, u = self.up(self.n2(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(g) * u), (k, v)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_pos, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.RMSNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, ids, pos, caches, mask):
            x = self.tok(ids) + self.pos(pos)
            new = []
            for block, cache in zip(self.blocks, caches):
                x, kv = block(x, cache, mask)
                new.append(kv)
            return self.head(self.norm(x[:, -1:])), new

    return Model()


def llama_serve(torch, steps, rng, device):
    layers, max_in_flight = 8, 8
    model = llama_like(torch, vocab=32000, max_pos=1024, d=1024, heads=16, kv_heads=4,
                       layers=layers, ffn=2816).to(device=device, dtype=torch.bfloat16).eval()
    pending = collections.deque((rng.randint(16, 512), rng.randint(8, 128)) for _ in range(steps))

    def pad_left(t, n):  # (B, H, S, D) -> (B, H, n + S, D)
        if n == 0:
            return t
        return torch.cat([t.new_zeros(t.shape[0], t.shape[1], n, t.shape[3]), t], dim=2)

    caches = valid = npos = last = None  # the batch in flight
    left = []  # tokens still to decode, per row
    with torch.no_grad():
        while pending or left:
            if pending and len(left) < max_in_flight and (not left or rng.random() < 0.35):
                REC.step()
                prompt, new = pending.popleft()
                ids = torch.randint(0, 32000, (1, prompt), device=device)
                pos = torch.arange(prompt, device=device)[None]
                logits, kv = model(ids, pos, [None] * layers, None)
                tok = logits.argmax(-1)
                row_valid = torch.ones(1, prompt, dtype=torch.bool, device=device)
                row_pos = torch.full((1,), prompt, device=device)
                if caches is None:
                    caches, valid, npos, last = kv, row_valid, row_pos, tok
                else:  # join: both left-padded to the longer cache
                    s_old, s_new = valid.shape[1], prompt
                    s = max(s_old, s_new)
                    caches = [(torch.cat([pad_left(k0, s - s_old), pad_left(k1, s - s_new)]),
                               torch.cat([pad_left(v0, s - s_old), pad_left(v1, s - s_new)]))
                              for (k0, v0), (k1, v1) in zip(caches, kv)]
                    valid = torch.cat([
                        torch.cat([valid.new_zeros(valid.shape[0], s - s_old), valid], dim=1),
                        torch.cat([valid.new_zeros(1, s - s_new), row_valid], dim=1)])
                    npos = torch.cat([npos, row_pos])
                    last = torch.cat([last, tok])
                left.append(new - 1)
                del ids, pos, logits, kv, tok, row_valid, row_pos
            # One decoding tick for every request in flight.
            b = len(left)
            ones = torch.ones(b, 1, dtype=torch.bool, device=device)
            valid = torch.cat([valid, ones], dim=1)
            logits, caches = model(last, npos[:, None], caches, valid[:, None, None, :])
            last = logits.argmax(-1)
            npos = npos + 1
            left = [n - 1 for n in left]
            del logits, ones
            done = [i for i, n in enumerate(left) if n <= 0]
            if done:
                keep = [i for i, n in enumerate(left) if n > 0]
                left = [left[i] for i in keep]
                if not keep:
                    caches = valid = npos = last = None
                    continue
                rows = torch.tensor(keep, device=device)
                caches = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in caches]
                valid, npos, last = valid[rows], npos[rows], last[rows]
                first = int(valid.any(0).nonzero()[0])
                if first > 0:  # columns that are padding in every row go
                    caches = [(k[:, :, first:].contiguous(), v[:, :, first:].contiguous())
                              for k, v in caches]
                    valid = valid[:, first:].contiguous()
                del rows
        REC.end()
    sync(torch, device)


def llm_serve_hf(torch, steps, rng, device):
    tf = need_transformers("llm-serve-hf")
    config = tf.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)
    model = tf.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval()
    body, head = model.model, model.lm_head
    pending = collections.deque(
        (rng.choice([1, 1, 2, 4]), rng.randint(16, 1024), rng.randint(8, 80)) for _ in range(steps))
    active = []  # [cache, last token, tokens left]
    with torch.no_grad():
        while pending or active:
            if pending and len(active) < 4 and (not active or rng.random() < 0.5):
                REC.step()
                batch, prompt, new = pending.popleft()
                ids = torch.randint(0, config.vocab_size, (batch, prompt), device=device)
                out = body(input_ids=ids, use_cache=True)
                active.append([out.past_key_values, head(out.last_hidden_state[:, -1:]).argmax(-1),
                               new - 1])
                del ids, out
            for request in list(active):  # a token for each, in turn
                out = body(input_ids=request[1], past_key_values=request[0], use_cache=True)
                request[0] = out.past_key_values
                request[1] = head(out.last_hidden_state[:, -1:]).argmax(-1)
                request[2] -= 1
                del out
                if request[2] <= 0:
                    active.remove(request)
            request = None  # a finished request's cache goes now
        REC.end()
    sync(torch, device)


def multi_model_serve(torch, steps, rng, device):
    tf = need_transformers("multi-model-serve")
    tv = need_torchvision("multi-model-serve")
    cpu = torch.device("cpu")
    bf16 = torch.bfloat16
    bert, bert_config = bert_base_model(tf)
    models = {
        "bert": bert.to(dtype=bf16).eval(),
        "resnet": tv.models.resnet50(num_classes=1000).to(dtype=bf16).eval(),
        "unet": unet_model(torch).to(dtype=bf16).eval(),
    }
    resident = []  # on the GPU, least recently used first; room for two
    with torch.no_grad():
        for _ in range(steps):  # one request a step
            REC.step()
            name = rng.choice(["bert", "bert", "resnet", "resnet", "unet"])
            if name in resident:
                resident.remove(name)
            else:
                if len(resident) == 2:
                    models[resident.pop(0)].to(cpu)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                models[name].to(device)
            resident.append(name)
            model = models[name]
            if name == "bert":
                ids, mask = bert_request(torch, rng, device, bert_config.vocab_size)
                model(input_ids=ids, attention_mask=mask).pooler_output.float().cpu()
                del ids, mask
            elif name == "resnet":
                size = rng.choice([160, 224, 288])
                x = torch.randn(rng.choice([1, 8, 32, 64]), 3, size, size, device=device, dtype=bf16)
                model(x).float().softmax(-1).cpu()
                del x
            else:
                res = rng.choice([32, 64, 96])
                x = torch.randn(rng.choice([1, 4, 8]), 3, res, res, device=device, dtype=bf16)
                for t in (999, 750, 500, 250, 0):
                    x = x - 0.1 * model(x, torch.full((x.shape[0],), t, device=device))
                x.float().cpu()
                del x
        REC.end()
    sync(torch, device)


def notebook_oom(torch, steps, rng, device):
    """A notebook session that runs out of memory, catches it and goes on."""
    nn = torch.nn
    cuda = device.type == "cuda"
    cap = 2 * GiB
    if cuda and not REC.args.cap_bytes:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(cap / total, device)
    elif REC.args.cap_bytes:
        cap = REC.args.cap_bytes
    # Cell 1: a model.
    model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                          nn.Linear(2048, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def train(n):
        for _ in range(n):
            REC.step()
            x = torch.randn(rng.choice([64, 256, 1024]), 1024, device=device)
            y = torch.randint(0, 10, (x.shape[0],), device=device)
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    # Cell 2: train.
    train(steps)
    if cuda:
        # Cell 3: a big scratch tensor, then many blocks carved out of its
        # cached segment; every other one is freed, so the segment holds
        # free bytes in holes that no larger request can use.
        scratch = torch.empty(768 * MiB, dtype=torch.uint8, device=device)
        del scratch
        blocks = [torch.empty(48 * MiB, dtype=torch.uint8, device=device) for _ in range(16)]
        del blocks[1::2]
        # Cell 4: a request that fits the free bytes under the cap, but not
        # in one piece.
        want = (cap - torch.cuda.memory_allocated(device) - 64 * MiB) // (2 * MiB) * (2 * MiB)
        try:
            big = torch.empty(want, dtype=torch.uint8, device=device)
            print(f"notebook-oom: {want} B fitted (no out-of-memory)", file=sys.stderr)
            del big
        except torch.cuda.OutOfMemoryError as e:
            print(f"notebook-oom: caught ({str(e).splitlines()[0][:120]})", file=sys.stderr)
        # Cell 5: a request larger than the cap.
        try:
            huge = torch.empty(cap + GiB, dtype=torch.uint8, device=device)
            del huge
        except torch.cuda.OutOfMemoryError as e:
            print(f"notebook-oom: caught ({str(e).splitlines()[0][:120]})", file=sys.stderr)
        # Cell 6: free the blocks; now the first request succeeds.
        del blocks
        big = torch.empty(want, dtype=torch.uint8, device=device)
        big.fill_(1)
        del big
    # Cell 7: train a little more.
    train(2)
    REC.end()
    sync(torch, device)


# name: (workload, default --steps)
WORKLOADS = {
    "resnet50-varbatch": (resnet50_varbatch, 40),
    "gpt2-varlen": (gpt2_varlen, 40),
    "gpt2-varlen-amp": (lambda t, s, r, d: gpt2_varlen(t, s, r, d, amp=True), 40),
    "bert-varlen": (bert_varlen, 40),
    "bert-varlen-amp": (lambda t, s, r, d: bert_varlen(t, s, r, d, amp=True), 40),
    "bert-infer": (bert_infer, 60),
    "bert-infer-bf16": (lambda t, s, r, d: bert_infer(t, s, r, d, dtype=t.bfloat16), 60),
    "t5-varlen-amp": (t5_varlen_amp, 30),
    "moe-train": (moe_train, 30),
    "moe-train-amp": (lambda t, s, r, d: moe_train(t, s, r, d, amp=True), 30),
    "model-switch": (model_switch, 48),
    "llm-decode": (llm_decode, 16),
    "llama-serve": (llama_serve, 32),
    "llm-serve-hf": (llm_serve_hf, 12),
    "convnext-varres-amp": (convnext_varres_amp, 24),
    "effnet-varres": (effnet_varres, 24),
    "deeplab-varres": (deeplab_varres, 16),
    "fcn-varres-amp": (fcn_varres_amp, 16),
    "fasterrcnn-varres": (fasterrcnn_varres, 18),
    "retinanet-varres": (retinanet_varres, 12),
    "unet-diffusion": (unet_diffusion, 30),
    "unet-diffusion-amp": (lambda t, s, r, d: unet_diffusion(t, s, r, d, amp=True), 30),
    "unet-sample": (unet_sample, 8),
    "multi-model-serve": (multi_model_serve, 30),
    "tiny-gpt": (tiny_gpt, 6),
    "notebook-oom": (notebook_oom, 3),
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
    if args.cap_bytes and cuda:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_bytes / total), device)
    record = record and cuda
    REC.setup(args, torch, device, record)
    if record and not args.after_load:
        # From the very start, so model weights are in the trace too.
        REC.start()
    # Everything the workload allocates is local to it, so it is all freed
    # (and recorded as freed) before the snapshot is written (unless
    # --dump-live wrote it at the end of the last step).
    WORKLOADS[args.workload][0](torch, args.steps, rng, device)
    gc.collect()
    sync(torch, device)
    if not cuda:
        return None
    if record:
        if REC.dump_stats is None and not REC.recording:
            sys.exit(f"{args.workload}: nothing was recorded (--after-load needs --steps 2 or more)")
        if REC.dump_stats is None:
            REC.dump()
        stats = dict(REC.dump_stats)
    else:
        stats = {
            "peak_allocated": torch.cuda.max_memory_allocated(device),
            "peak_reserved": torch.cuda.max_memory_reserved(device),
        }
    stats["device_name"] = torch.cuda.get_device_name(device)
    stats["total_memory"] = torch.cuda.get_device_properties(device).total_memory
    stats["torch_version"] = torch.__version__
    return stats


# ---------------------------------------------------------------- snapshot facts

def shorten_paths(obj, repo):
    """Shortens every stack frame's file name in a snapshot, in place."""
    if isinstance(obj, dict):
        name = obj.get("filename")
        if isinstance(name, str):
            if "site-packages/" in name:
                name = "site-packages/" + name.split("site-packages/", 1)[1]
            elif name.startswith(repo + os.sep):
                name = os.path.relpath(name, repo)
            elif "/lib/python" in name:
                name = "lib/python" + name.split("/lib/python", 1)[1]
            elif os.path.isabs(name):
                name = os.path.basename(name)
            obj["filename"] = name
        for value in obj.values():
            if isinstance(value, (dict, list)):
                shorten_paths(value, repo)
    elif isinstance(obj, list):
        for value in obj:
            if isinstance(value, (dict, list)):
                shorten_paths(value, repo)


def snapshot_facts(snap):
    """What a snapshot reader must find in a snapshot, per device."""
    devices = {}

    def dev(i):
        return devices.setdefault(str(i), {
            "events": {}, "events_total": 0, "segments": 0, "segments_expandable": 0,
            "segments_total_size": 0, "segments_allocated_size": 0,
            "segments_active_size": 0, "segments_requested_size": 0,
            "blocks": {}, "active_allocated_blocks": 0, "active_allocated_size": 0,
            "active_allocated_requested_size": 0})

    for i, trace in enumerate(snap.get("device_traces", [])):
        d = dev(i)
        d["events"] = dict(sorted(collections.Counter(e["action"] for e in trace).items()))
        d["events_total"] = len(trace)
        if trace:
            d["first_time_us"], d["last_time_us"] = trace[0]["time_us"], trace[-1]["time_us"]
    for seg in snap.get("segments", []):
        d = dev(seg["device"])
        d["segments"] += 1
        d["segments_expandable"] += bool(seg.get("is_expandable"))
        d["segments_total_size"] += seg["total_size"]
        d["segments_allocated_size"] += seg.get("allocated_size", 0)
        d["segments_active_size"] += seg.get("active_size", 0)
        d["segments_requested_size"] += seg.get("requested_size", 0)
        for block in seg["blocks"]:
            d["blocks"][block["state"]] = d["blocks"].get(block["state"], 0) + 1
            if block["state"] == "active_allocated":
                d["active_allocated_blocks"] += 1
                d["active_allocated_size"] += block["size"]
                d["active_allocated_requested_size"] += block["requested_size"]
    return {"devices": dict(sorted(devices.items())),
            "top_level_keys": sorted(snap.keys()),
            "has_frames": any(e.get("frames") for t in snap.get("device_traces", []) for e in t)}


def finish_snapshot(args, stats):
    """Shortens paths (--short-paths), gzips (a .gz --out) and writes
    --stats-json with the snapshot's facts."""
    raw = raw_out(args.out)
    with open(raw, "rb") as f:
        snap = pickle.load(f)
    if args.short_paths:
        shorten_paths(snap, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(raw, "wb") as f:
            pickle.dump(snap, f)
    stats["pickle_bytes"] = os.path.getsize(raw)
    if args.out.endswith(".gz"):
        with open(raw, "rb") as src, gzip.open(args.out, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
        stats["gz_bytes"] = os.path.getsize(args.out)
    if args.stats_json:
        stats.update(snapshot_facts(snap))
        with open(args.stats_json, "w") as f:
            json.dump(stats, f, indent=1)
            f.write("\n")


# ---------------------------------------------------------------- --find-cap

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


# ---------------------------------------------------------------- drivers

# Fixtures for the snapshot reader: (name, workload, options, environment).
# Each is dumped while its model is alive (--dump-live).
FIXTURES = [
    # Recording starts after the model, the optimizer and one warm-up step:
    # weights and AdamW state are in `segments` with no `alloc` event.
    ("after_load", "tiny-gpt", ["--seed", "1", "--steps", "4", "--after-load", "--dump-live"], {}),
    # PyTorch's ring buffer keeps the last 3000 of many more entries.
    ("ring_buffer", "tiny-gpt", ["--seed", "2", "--steps", "16", "--max-entries", "3000",
                                 "--dump-live"], {}),
    # Out of memory twice (caught), with Python stacks.
    ("oom_caught", "notebook-oom", ["--seed", "3", "--steps", "3", "--stacks", "--short-paths",
                                    "--dump-live"], {}),
    # Expandable segments: segment_map, and segment_unmap from empty_cache().
    ("expandable", "tiny-gpt", ["--seed", "4", "--steps", "6", "--empty-cache-every", "3",
                                "--dump-live"],
     {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    # Two recordings, merged below into one snapshot of two devices.
    ("two_devices_a", "tiny-gpt", ["--seed", "5", "--steps", "3", "--dump-live"], {}),
    ("two_devices_b", "tiny-gpt", ["--seed", "6", "--steps", "3", "--dump-live"], {}),
]

ONESTEP = ["--after-load", "--dump-live", "--steps", "2", "--seed", "3"]

# The corpus: (file name, workload, options, estimated peak reserved GiB).
CORPUS = [
    ("resnet50-varbatch_s1", "resnet50-varbatch", ["--seed", "1", "--steps", "20"], 26),
    ("deeplab-varres_s0", "deeplab-varres", ["--seed", "0"], 20),
    ("model-switch_s1", "model-switch", ["--seed", "1", "--steps", "24"], 16),
    ("bert-varlen_s1", "bert-varlen", ["--seed", "1", "--steps", "20"], 15),
    ("fcn-varres-amp_s1", "fcn-varres-amp", ["--seed", "1"], 14),
    ("effnet-varres_s0", "effnet-varres", ["--seed", "0"], 14),
    ("convnext-varres-amp_s0", "convnext-varres-amp", ["--seed", "0"], 12),
    ("bert-varlen-amp_s2", "bert-varlen-amp", ["--seed", "2", "--steps", "24"], 10),
    ("retinanet-varres_s0", "retinanet-varres", ["--seed", "0"], 10),
    ("unet-diffusion_s0", "unet-diffusion", ["--seed", "0"], 10),
    ("gpt2-varlen_s1", "gpt2-varlen", ["--seed", "1"], 22),
    ("gpt2-varlen-amp_s2", "gpt2-varlen-amp", ["--seed", "2"], 20),
    ("t5-varlen-amp_s0", "t5-varlen-amp", ["--seed", "0"], 8),
    ("moe-train_s0", "moe-train", ["--seed", "0"], 8),
    ("moe-train-amp_s1", "moe-train-amp", ["--seed", "1"], 6),
    ("fasterrcnn-varres_s0", "fasterrcnn-varres", ["--seed", "0"], 8),
    ("unet-diffusion-amp_s1", "unet-diffusion-amp", ["--seed", "1"], 6),
    ("unet-sample_s0", "unet-sample", ["--seed", "0"], 4),
    ("bert-infer_s0", "bert-infer", ["--seed", "0"], 6),
    ("bert-infer-bf16_s1", "bert-infer-bf16", ["--seed", "1"], 4),
    ("llm-decode_s0", "llm-decode", ["--seed", "0", "--steps", "8"], 2),
    ("llm-decode_s1", "llm-decode", ["--seed", "1", "--steps", "8"], 2),
    ("llm-decode_s2", "llm-decode", ["--seed", "2", "--steps", "8"], 2),
    ("llama-serve_s0", "llama-serve", ["--seed", "0"], 3),
    ("llama-serve_s1", "llama-serve", ["--seed", "1", "--steps", "40"], 3),
    ("llm-serve-hf_s0", "llm-serve-hf", ["--seed", "0"], 3),
    ("multi-model-serve_s0", "multi-model-serve", ["--seed", "0"], 4),
    ("gpt2-varlen-amp_onestep", "gpt2-varlen-amp", ONESTEP, 8),
    ("deeplab-varres_onestep", "deeplab-varres", ONESTEP, 20),
    ("t5-varlen-amp_onestep", "t5-varlen-amp", ONESTEP, 8),
]


# What-if recordings for the model of PyTorch's caching allocator
# (`cuarena replay`'s `pytorch_sim`): a corpus trace recorded under the
# default settings, and the same run under other settings in the same
# session, so that the model's prediction from the default recording can be
# compared with the reserved peak PyTorch reports under each setting.
# (corpus name, tag, PYTORCH_CUDA_ALLOC_CONF)
SETTINGS_RUNS = [
    ("llama-serve_s0", "exp", "expandable_segments:True"),
    ("bert-varlen_s1", "exp", "expandable_segments:True"),
    ("unet-diffusion-amp_s1", "exp", "expandable_segments:True"),
    ("effnet-varres_s0", "exp", "expandable_segments:True"),
    ("t5-varlen-amp_s0", "exp", "expandable_segments:True"),
    ("moe-train-amp_s1", "exp", "expandable_segments:True"),
    ("llama-serve_s0", "ms128", "max_split_size_mb:128"),
    ("unet-diffusion-amp_s1", "ms128", "max_split_size_mb:128"),
    ("t5-varlen-amp_s0", "ms128", "max_split_size_mb:128"),
]


def record_settings(out_dir, args):
    """The CORPUS traces named by --only (all if none), each under the
    default settings (NAME.pickle.gz) and under every SETTINGS_RUNS entry
    for it (NAME__TAG.pickle.gz), in one pool of jobs; a JSON of facts
    each, and manifest.json."""
    os.makedirs(out_dir, exist_ok=True)
    info = device_info()
    total_gib = info["total_memory"] / GiB
    budget = args.budget_gib or 0.85 * total_gib
    only = args.only.split(",") if args.only else None
    jobs = []
    for name, workload, opts, est in CORPUS:
        if only and name not in only:
            continue
        cap = int(min(total_gib * 0.95, max(2 * est, est + 6)) * GiB)
        runs = [("", "")] + [(tag, conf) for n, tag, conf in SETTINGS_RUNS if n == name]
        if args.tags:
            tags = args.tags.split(",")
            runs = [(t, c) for t, c in runs if (t or "default") in tags]
        for tag, conf in runs:
            jobs.append({"name": name + (f"__{tag}" if tag else ""), "workload": workload,
                         "opts": opts, "est_gib": est, "cap": cap,
                         "env": {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {},
                         "conf": conf})
    # The default recordings first: they are the corpus.
    jobs.sort(key=lambda j: bool(j["conf"]))
    results = run_jobs(jobs, out_dir, args.jobs, budget, args.deadline, args.job_timeout)
    manifest = {"device": info, "traces": []}
    for job in jobs:
        res = results.get(job["name"], {"status": "not run"})
        entry = {"file": job["name"] + ".pickle.gz", "workload": job["workload"],
                 "args": job["opts"], "cap_bytes": job["cap"], "alloc_conf": job["conf"], **res}
        stats_path = os.path.join(out_dir, job["name"] + ".json")
        if res.get("status") == "ok" and os.path.exists(stats_path):
            with open(stats_path) as f:
                s = json.load(f)
            dev0 = s["devices"].get("0", {})
            entry.update({"peak_allocated": s["peak_allocated"],
                          "peak_reserved": s["peak_reserved"],
                          "allocated_at_dump": s["allocated_at_dump"],
                          "events": dev0.get("events", {}), "gz_bytes": s.get("gz_bytes")})
        manifest["traces"].append(entry)
        print(f"{job['name']}: {entry.get('status')}, peak reserved {entry.get('peak_reserved')}",
              flush=True)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest

def run_jobs(jobs, out_dir, n_parallel, budget_gib, deadline_s, job_timeout):
    """Runs jobs (dicts: name, workload, opts, env, est_gib, cap) as
    subprocesses, at most n_parallel at once and at most budget_gib of
    estimated memory together; none starts after deadline_s. Returns
    {name: result}."""
    t0 = time.time()
    waiting, running, results = list(jobs), [], {}
    script = os.path.abspath(__file__)
    while waiting or running:
        for job, proc, start, log in list(running):
            rc = proc.poll()
            if rc is None and time.time() - start > job_timeout:
                proc.kill()
                rc = proc.wait()
                rc = f"killed after {job_timeout} s"
            if rc is None:
                continue
            log.close()
            running.remove((job, proc, start, log))
            res = {"status": "ok" if rc == 0 else f"failed ({rc})", "wall_s": round(time.time() - start, 1)}
            if rc != 0:
                with open(os.path.join(out_dir, job["name"] + ".log")) as f:
                    res["log_tail"] = f.read()[-1500:]
            results[job["name"]] = res
            print(f"[{time.time() - t0:6.1f} s] {job['name']}: {res['status']} in {res['wall_s']} s",
                  flush=True)
        used = sum(j["est_gib"] for j, *_ in running)
        started = False
        if waiting and len(running) < n_parallel:
            if time.time() - t0 > deadline_s:
                for job in waiting:
                    results[job["name"]] = {"status": "not started (deadline)"}
                    print(f"{job['name']}: not started (deadline)", flush=True)
                waiting = []
                continue
            for job in waiting:
                if used + job["est_gib"] <= budget_gib or not running:
                    cmd = [sys.executable, script, job["workload"], *job["opts"],
                           "--out", os.path.join(out_dir, job["name"] + ".pickle.gz"),
                           "--stats-json", os.path.join(out_dir, job["name"] + ".json")]
                    if job.get("cap"):
                        cmd += ["--cap-bytes", str(job["cap"])]
                    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="4")
                    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
                    env.update(job.get("env", {}))
                    log = open(os.path.join(out_dir, job["name"] + ".log"), "w")
                    log.write(" ".join(cmd) + "\n")
                    log.flush()
                    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
                    running.append((job, proc, time.time(), log))
                    waiting.remove(job)
                    print(f"[{time.time() - t0:6.1f} s] start {job['name']} "
                          f"(~{job['est_gib']} GiB; {used + job['est_gib']} GiB in flight)", flush=True)
                    started = True
                    break
        if not started:
            time.sleep(0.5)
    return results


def device_info():
    import torch
    props = torch.cuda.get_device_properties(0)
    return {"device_name": torch.cuda.get_device_name(0), "total_memory": props.total_memory,
            "device_count": torch.cuda.device_count(), "torch_version": torch.__version__}


def record_fixtures(out_dir, args):
    os.makedirs(out_dir, exist_ok=True)
    info = device_info()
    print(f"fixtures on {info['device_name']} (torch {info['torch_version']})", flush=True)
    jobs = [{"name": "snap_" + name, "workload": workload, "opts": opts, "env": env,
             "est_gib": 2} for name, workload, opts, env in FIXTURES]
    results = run_jobs(jobs, out_dir, args.jobs, 64, args.deadline, args.job_timeout)
    a, b = (os.path.join(out_dir, "snap_two_devices_" + x) for x in "ab")
    if all(results.get("snap_two_devices_" + x, {}).get("status") == "ok" for x in "ab"):
        with gzip.open(a + ".pickle.gz") as f:
            snap = pickle.load(f)
        with gzip.open(b + ".pickle.gz") as f:
            second = pickle.load(f)
        # The second recording becomes device 1: its trace at index 1, its
        # segments with device 1. Addresses are kept as recorded.
        snap["device_traces"] = [snap["device_traces"][0], second["device_traces"][0]]
        for seg in second["segments"]:
            seg["device"] = 1
        snap["segments"] = snap["segments"] + second["segments"]
        merged = os.path.join(out_dir, "snap_two_devices")
        with gzip.open(merged + ".pickle.gz", "wb", compresslevel=9) as f:
            pickle.dump(snap, f)
        with open(a + ".json") as f:
            sa = json.load(f)
        with open(b + ".json") as f:
            sb = json.load(f)
        facts = {"merged_from": ["snap_two_devices_a", "snap_two_devices_b"],
                 "per_device_dump_stats": {
                     str(i): {k: s[k] for k in ("peak_allocated", "peak_reserved",
                                                "allocated_at_dump", "reserved_at_dump")}
                     for i, s in enumerate((sa, sb))},
                 "device_name": sa["device_name"], "torch_version": sa["torch_version"],
                 "gz_bytes": os.path.getsize(merged + ".pickle.gz")}
        facts.update(snapshot_facts(snap))
        with open(merged + ".json", "w") as f:
            json.dump(facts, f, indent=1)
            f.write("\n")
        results["snap_two_devices"] = {"status": "ok (merged)"}
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"device": info, "results": results}, f, indent=1)
    return results


def record_corpus(out_dir, args):
    os.makedirs(out_dir, exist_ok=True)
    info = device_info()
    total_gib = info["total_memory"] / GiB
    budget = args.budget_gib or 0.85 * total_gib
    print(f"corpus on {info['device_name']} (torch {info['torch_version']}, "
          f"{total_gib:.1f} GiB, {budget:.0f} GiB of estimates at once)", flush=True)
    jobs = []
    for name, workload, opts, est in CORPUS:
        if args.only and name not in args.only.split(","):
            continue
        cap = int(min(total_gib * 0.95, max(2 * est, est + 6)) * GiB)
        jobs.append({"name": name, "workload": workload, "opts": opts, "est_gib": est, "cap": cap})
    results = run_jobs(jobs, out_dir, args.jobs, budget, args.deadline, args.job_timeout)
    manifest = {"device": info, "traces": []}
    for job in jobs:
        res = results.get(job["name"], {"status": "not run"})
        entry = {"file": job["name"] + ".pickle.gz", "workload": job["workload"],
                 "args": job["opts"], "cap_bytes": job["cap"], **res}
        opts = job["opts"]
        entry["seed"] = int(opts[opts.index("--seed") + 1]) if "--seed" in opts else 0
        entry["steps"] = int(opts[opts.index("--steps") + 1]) if "--steps" in opts \
            else WORKLOADS[job["workload"]][1]
        stats_path = os.path.join(out_dir, job["name"] + ".json")
        if res.get("status") == "ok" and os.path.exists(stats_path):
            with open(stats_path) as f:
                s = json.load(f)
            dev0 = s["devices"].get("0", {})
            entry.update({
                "peak_allocated": s["peak_allocated"], "peak_reserved": s["peak_reserved"],
                "allocated_at_dump": s["allocated_at_dump"],
                "near_cap": s["peak_reserved"] > 0.9 * job["cap"],
                "events": dev0.get("events", {}), "gz_bytes": s.get("gz_bytes"),
                "pickle_bytes": s.get("pickle_bytes")})
        manifest["traces"].append(entry)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print()
    print("| trace | status | wall s | allocs | gz MB | peak allocated GiB | peak reserved GiB |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for e in manifest["traces"]:
        if "peak_allocated" in e:
            print(f"| {e['file']} | ok | {e['wall_s']} | {e['events'].get('alloc', 0)} | "
                  f"{e['gz_bytes'] / 1e6:.2f} | {e['peak_allocated'] / GiB:.2f} | "
                  f"{e['peak_reserved'] / GiB:.2f} |")
        else:
            print(f"| {e['file']} | {e['status']} | {e.get('wall_s', '')} | | | | |")
    return manifest


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", nargs="?", choices=sorted(WORKLOADS))
    ap.add_argument("--steps", type=int,
                    help="training steps (llm-decode and the other serving workloads: requests); "
                         "default per workload, above")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda:0",
                    help="default cuda:0; cpu runs the workload without recording (a check)")
    ap.add_argument("--out", help="snapshot pickle to write (default WORKLOAD.pickle); "
                                  "gzipped if it ends in .gz")
    ap.add_argument("--find-cap", action="store_true",
                    help="search for the smallest memory cap that completes")
    ap.add_argument("--stacks", action="store_true",
                    help='record Python stacks (context="all", stacks="python")')
    ap.add_argument("--max-entries", type=int, help="keep only the last N trace entries")
    ap.add_argument("--after-load", action="store_true",
                    help="start recording after the first (warm-up) step")
    ap.add_argument("--dump-live", action="store_true",
                    help="write the snapshot at the end of the last step, tensors alive")
    ap.add_argument("--empty-cache-every", type=int, metavar="K",
                    help="torch.cuda.empty_cache() before every K-th step")
    ap.add_argument("--expandable", action="store_true",
                    help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    ap.add_argument("--cap-bytes", type=int,
                    help="cap the process at B bytes (set_per_process_memory_fraction)")
    ap.add_argument("--short-paths", action="store_true",
                    help="shorten source file names in recorded stack frames")
    ap.add_argument("--stats-json", help="write peaks and the snapshot's facts as JSON")
    ap.add_argument("--fixtures", metavar="DIR", help="record the snapshot-reader fixtures")
    ap.add_argument("--corpus", metavar="DIR", help="record the corpus")
    ap.add_argument("--only", help="--corpus, --settings: only these traces (comma-separated names)")
    ap.add_argument("--settings", metavar="DIR",
                    help="record CORPUS traces (--only) under the default and SETTINGS_RUNS")
    ap.add_argument("--tags", help="--settings: only these settings (comma-separated tags; "
                    "`default` for the default run)")
    ap.add_argument("--budget-gib", type=float,
                    help="drivers: estimated GiB in flight at once (default 0.85 of the GPU)")
    ap.add_argument("--jobs", type=int, default=4, help="drivers: jobs at once (4)")
    ap.add_argument("--deadline", type=float, default=420,
                    help="drivers: no job starts after this many seconds (420)")
    ap.add_argument("--job-timeout", type=float, default=180,
                    help="drivers: a job is killed after this many seconds (180)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.fixtures or args.corpus or args.settings:
        if args.settings:
            record_settings(args.settings, args)
        if args.fixtures:
            record_fixtures(args.fixtures, args)
        if args.corpus:
            record_corpus(args.corpus, args)
        return
    if args.workload is None:
        ap.error("name a workload (or --fixtures DIR / --corpus DIR)")
    if args.steps is None:
        args.steps = WORKLOADS[args.workload][1]
    if args.find_cap and not args.device.startswith("cuda"):
        ap.error("--find-cap needs a CUDA device")
    if args.expandable:
        # Before torch initialises CUDA (torch is imported later).
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

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
    start = time.time()
    stats = run_workload(args, record=True)
    if stats is None:
        print(f"ran {args.workload} for {args.steps} steps on {args.device}; nothing recorded "
              "(traces need a CUDA device)")
        return
    argv = [os.path.basename(a) if os.path.isabs(a) else a for a in sys.argv[1:]]
    stats.update({"workload": args.workload, "argv": argv, "seed": args.seed,
                  "steps": args.steps, "run_s": round(time.time() - start, 1),
                  "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")})
    finish_snapshot(args, stats)
    print(f"wrote {args.out}")
    print(f"peak allocated {stats['peak_allocated']:,} B ({stats['peak_allocated'] / 2**30:.2f} GiB), "
          f"peak reserved {stats['peak_reserved']:,} B ({stats['peak_reserved'] / 2**30:.2f} GiB)")
    if args.find_cap:
        find_cap(args)


if __name__ == "__main__":
    main()
