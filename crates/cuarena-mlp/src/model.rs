//! The model on the arena: parameters, forward and backward passes, the
//! data loader and the training loop.

use super::*;
use cuarena::DType;

// ---- the model on the arena -------------------------------------------------------

pub fn alloc_f32<E: Exec>(e: &mut E, n: usize) -> Res<Storage> {
    Ok(e.arena().alloc_storage_dtype(DType::F32, n as u64)?)
}

/// `n` zeros of `f32` (filled on the arena stream).
pub fn zeros_f32<E: Exec>(e: &mut E, n: usize) -> Res<Storage> {
    let s = alloc_f32(e, n)?;
    e.arena().fill(&s, 0f32)?;
    Ok(s)
}

/// The block of a tensor, for the executors (which take handles: every
/// tensor here has at least one element, so it has a block). The handle is
/// resolved to an address only when a kernel is enqueued.
pub fn h(s: &Storage) -> Handle {
    s.handle().expect("every tensor of the loop has a block")
}

/// A layer's parameters (and momentum, for the student) in the arena.
#[derive(Debug, Clone)]
pub struct Layer {
    pub w: Storage,
    pub b: Storage,
    pub momentum: Option<(Storage, Storage)>,
    pub fan_in: usize,
    pub fan_out: usize,
}

#[derive(Debug, Clone)]
pub struct Net {
    pub layers: Vec<Layer>,
}

impl Net {
    pub fn upload<E: Exec>(e: &mut E, host: &HostNet, momentum: bool) -> Res<Self> {
        let mut layers = Vec::new();
        for l in &host.layers {
            let w = alloc_f32(e, l.w.len())?;
            e.arena().write(&w, &l.w)?;
            let b = alloc_f32(e, l.b.len())?;
            e.arena().write(&b, &l.b)?;
            let momentum = if momentum {
                let vw = zeros_f32(e, l.w.len())?;
                let vb = zeros_f32(e, l.b.len())?;
                Some((vw, vb))
            } else {
                None
            };
            layers.push(Layer {
                w,
                b,
                momentum,
                fan_in: l.fan_in,
                fan_out: l.fan_out,
            });
        }
        Ok(Self { layers })
    }

    pub fn download<E: Exec>(&self, e: &mut E) -> Res<HostNet> {
        let mut layers = Vec::new();
        for l in &self.layers {
            // Reads need the blocks resident (spilled ones come back).
            e.arena().make_resident(&[&l.w])?;
            let w = e.arena().read::<f32>(h(&l.w))?;
            e.arena().make_resident(&[&l.b])?;
            let b = e.arena().read::<f32>(h(&l.b))?;
            layers.push(HostLayer {
                w,
                b,
                fan_in: l.fan_in,
                fan_out: l.fan_out,
            });
        }
        Ok(HostNet { layers })
    }
}

/// Activations of a forward pass: `z[i]` before and `h[i]` after the ReLU
/// of hidden layer i; the last `z` is the logits. Owned: the backward pass
/// consumes them, layer by layer, so each is dropped (and its block goes
/// back to the arena) right after its last use.
pub struct Fwd {
    pub z: Vec<Storage>,
    pub h: Vec<Storage>,
}

/// Forward pass of `n` rows of `x`. With `keep` every activation is kept
/// for the backward pass; without, each is dropped as soon as it is used
/// and only the logits are returned.
pub fn forward<E: Exec>(e: &mut E, net: &Net, x: &Storage, n: usize, keep: bool) -> Res<Fwd> {
    let (mut z_all, mut h_all) = (Vec::new(), Vec::new());
    // The previous layer's output when it is not kept.
    let mut owned: Option<Storage> = None;
    let mut input = h(x);
    let last = net.layers.len() - 1;
    for (i, l) in net.layers.iter().enumerate() {
        let z = alloc_f32(e, n * l.fan_out)?;
        e.run(Kernel::matmul(
            Op::NN,
            input,
            h(&l.w),
            h(&z),
            (n, l.fan_out, l.fan_in),
        ))?;
        e.run(Kernel::BiasAdd {
            z: h(&z),
            b: h(&l.b),
            rows: n,
            cols: l.fan_out,
        })?;
        // Its last use was the product above.
        drop(owned.take());
        if i == last {
            z_all.push(z);
            break;
        }
        let a = alloc_f32(e, n * l.fan_out)?;
        e.run(Kernel::Relu {
            z: h(&z),
            h: h(&a),
            len: n * l.fan_out,
        })?;
        input = h(&a);
        if keep {
            z_all.push(z);
            h_all.push(a);
        } else {
            owned = Some(a);
        }
    }
    debug_assert!(owned.is_none());
    Ok(Fwd { z: z_all, h: h_all })
}

/// Loss of `logits` against `labels`, accumulated into `metrics`; returns
/// the gradient of the mean loss when `grad`.
pub fn loss<E: Exec>(
    e: &mut E,
    logits: &Storage,
    labels: &Storage,
    n: usize,
    metrics: &Storage,
    grad: bool,
) -> Res<Option<Storage>> {
    let stats = alloc_f32(e, 2 * n)?;
    let dlogits = if grad {
        Some(alloc_f32(e, n * CLASSES)?)
    } else {
        None
    };
    e.run(Kernel::SoftmaxXent {
        logits: h(logits),
        labels: h(labels),
        dlogits: dlogits.as_ref().map(h),
        stats: h(&stats),
        rows: n,
        cols: CLASSES,
    })?;
    e.run(Kernel::Mean2Acc {
        stats: h(&stats),
        out: h(metrics),
        n,
    })?;
    Ok(dlogits)
}

/// Backward pass: consumes the activations (each dropped after its last
/// use) and the gradient of the logits, and returns the gradients
/// `(dW, db)` per layer. Calls `bucket(e, layer, (dW, db))` as soon as a
/// layer's gradients are computed (last layer first), before the rest of
/// the pass is enqueued: where data-parallel training starts their
/// all-reduce.
pub fn backward<E: Exec>(
    e: &mut E,
    net: &Net,
    x: &Storage,
    n: usize,
    fwd: Fwd,
    dlogits: Storage,
    mut bucket: impl FnMut(&mut E, usize, &(Storage, Storage)) -> Res<()>,
) -> Res<Vec<(Storage, Storage)>> {
    let Fwd {
        z: mut zs,
        h: mut hs,
    } = fwd;
    let mut grads = Vec::with_capacity(net.layers.len());
    let mut dz = dlogits;
    for (i, l) in net.layers.iter().enumerate().rev() {
        // The input of layer i: the batch, or the previous layer's output.
        let h_prev = if i == 0 {
            None
        } else {
            Some(hs.pop().ok_or("missing activation")?)
        };
        let input = h_prev.as_ref().map_or(h(x), h);
        let gw = alloc_f32(e, l.fan_in * l.fan_out)?;
        e.run(Kernel::matmul(
            Op::TN,
            input,
            h(&dz),
            h(&gw),
            (l.fan_in, l.fan_out, n),
        ))?;
        let gb = alloc_f32(e, l.fan_out)?;
        e.run(Kernel::ColSum {
            x: h(&dz),
            out: h(&gb),
            rows: n,
            cols: l.fan_out,
        })?;
        let g = (gw, gb);
        bucket(e, i, &g)?;
        grads.push(g);
        if i == 0 {
            break;
        }
        let dh = alloc_f32(e, n * l.fan_in)?;
        e.run(Kernel::matmul(
            Op::NT,
            h(&dz),
            h(&l.w),
            h(&dh),
            (n, l.fan_in, l.fan_out),
        ))?;
        // Last uses of dz and of this layer's input: their blocks are free
        // for the next allocation.
        drop(dz);
        drop(h_prev);
        let z_prev = zs.pop().ok_or("missing activation")?;
        let dz_prev = alloc_f32(e, n * l.fan_in)?;
        e.run(Kernel::ReluBwd {
            dh: h(&dh),
            z: h(&z_prev),
            dz: h(&dz_prev),
            len: n * l.fan_in,
        })?;
        dz = dz_prev;
    }
    grads.reverse();
    Ok(grads)
}

/// SGD with momentum on every layer; the gradients are then dropped in a
/// random order (more holes).
pub fn update<E: Exec>(
    e: &mut E,
    net: &Net,
    grads: Vec<(Storage, Storage)>,
    lr: f32,
    mu: f32,
    sched: &mut Rng,
) -> Res<()> {
    for (l, (gw, gb)) in net.layers.iter().zip(&grads) {
        let (vw, vb) = l
            .momentum
            .as_ref()
            .ok_or("the student has momentum buffers")?;
        for (w, g, v, len) in [
            (&l.w, gw, vw, l.fan_in * l.fan_out),
            (&l.b, gb, vb, l.fan_out),
        ] {
            e.run(Kernel::Sgd {
                w: h(w),
                g: h(g),
                v: h(v),
                len,
                lr,
                mu,
            })?;
        }
    }
    let mut all: Vec<Storage> = grads.into_iter().flat_map(|(w, b)| [w, b]).collect();
    // Dropped in this order at the end of the call.
    sched.shuffle(&mut all);
    Ok(())
}

/// Labels of `n` rows of `x`: the teacher's argmax, computed on the device.
pub fn label<E: Exec>(e: &mut E, teacher: &Net, x: &Storage, y: &Storage, n: usize) -> Res<()> {
    let fwd = forward(e, teacher, x, n, false)?;
    e.run(Kernel::Argmax {
        logits: h(&fwd.z[0]),
        labels: h(y),
        rows: n,
        cols: CLASSES,
    })
}

/// A training batch: inputs and labels, owned; dropped after its step.
pub struct Batch {
    pub x: Storage,
    pub y: Storage,
    pub n: usize,
}

/// The data loader: a batch of random size whose Gaussian inputs are
/// copied from the host on the executor's upload stream (overlapping the
/// step in progress). Its labels are computed (by the teacher, on the
/// device) when the batch is taken: see [`take_batch`].
pub fn make_batch<E: Exec>(
    e: &mut E,
    s: &Settings,
    sched: &mut Rng,
    data: &mut Rng,
    buf: &mut Vec<f32>,
    pool: &[f32],
) -> Res<Batch> {
    let n = sched.batch(s.min_batch, s.max_batch);
    let x = alloc_f32(e, n * IN)?;
    let y = e.arena().alloc_storage_dtype(DType::I32, n as u64)?;
    buf.clear();
    if e.arena().backend().stores_bytes() {
        if pool.len() >= n * IN {
            let start = data.below(pool.len() - n * IN + 1);
            buf.extend_from_slice(&pool[start..start + n * IN]);
        } else {
            buf.extend((0..n * IN).map(|_| data.normal()));
        }
    }
    e.upload(&x, buf)?;
    Ok(Batch { x, y, n })
}

/// A prefetched batch made ready for its step: the compute waits for its
/// upload, and the teacher labels it.
pub fn take_batch<E: Exec>(e: &mut E, teacher: &Net, b: &Batch) -> Res<()> {
    e.await_upload(&b.x)?;
    label(e, teacher, &b.x, &b.y, b.n)
}

/// Reads an accumulator `[loss, accuracy]` divided by `count`, and zeroes it.
pub fn take_metrics<E: Exec>(e: &mut E, m: &Storage, count: usize) -> Res<(f32, f32)> {
    e.arena().make_resident(&[m])?;
    let v = e.arena().read::<f32>(h(m))?;
    e.arena().write(m, &[0.0f32, 0.0])?;
    let c = count.max(1) as f32;
    Ok((v[0] / c, v[1] / c))
}

/// One line of the learning curve.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub step: usize,
    pub batch: usize,
    /// Mean loss and accuracy of the training batches since the last point.
    pub train: Option<(f32, f32)>,
    pub eval_loss: f32,
    pub eval_acc: f32,
}

impl Point {
    pub fn print<B: Backend>(&self, arena: &Arena<B>) {
        let st = arena.stats();
        let train = match self.train {
            Some((l, a)) => format!("train loss {l:.4} acc {a:.3}"),
            None => format!("{:<24}", "(before training)"),
        };
        println!(
            "step {:>5}  batch {:>4}  {train}  eval loss {:.4} acc {:.3}  | compactions {:>4} ({} targeted, {} full), moved {}",
            self.step,
            self.batch,
            self.eval_loss,
            self.eval_acc,
            st.targeted_compactions + st.full_compactions,
            st.targeted_compactions,
            st.full_compactions,
            fmt_bytes(st.bytes_moved)
        );
    }
}

/// Loss and accuracy of `net` on the eval batch (activations allocated and
/// dropped as it goes).
pub fn evaluate<E: Exec>(
    e: &mut E,
    net: &Net,
    x: &Storage,
    y: &Storage,
    metrics: &Storage,
) -> Res<(f32, f32)> {
    let f = forward(e, net, x, EVAL_ROWS, false)?;
    loss(e, &f.z[0], y, EVAL_ROWS, metrics, false)?;
    drop(f);
    take_metrics(e, metrics, 1)
}

/// What a run uploads before its first step, in this order: the teacher,
/// the eval inputs and their labels (computed by the teacher, on the
/// device), the student with its momentum, and the accumulators of the
/// training batches' and the evaluations' loss and accuracy.
pub struct Setup {
    pub teacher: Net,
    pub eval_x: Storage,
    pub eval_y: Storage,
    pub net: Net,
    pub train_metrics: Storage,
    pub eval_metrics: Storage,
}

impl Setup {
    pub fn new<E: Exec>(e: &mut E, p: &Problem) -> Res<Self> {
        let teacher = Net::upload(e, &p.teacher, false)?;
        let eval_x = alloc_f32(e, EVAL_ROWS * IN)?;
        e.arena().write(&eval_x, &p.eval_x)?;
        let eval_y = e
            .arena()
            .alloc_storage_dtype(DType::I32, EVAL_ROWS as u64)?;
        label(e, &teacher, &eval_x, &eval_y, EVAL_ROWS)?;
        let net = Net::upload(e, &p.student, true)?;
        let train_metrics = zeros_f32(e, 2)?;
        let eval_metrics = zeros_f32(e, 2)?;
        Ok(Self {
            teacher,
            eval_x,
            eval_y,
            net,
            train_metrics,
            eval_metrics,
        })
    }

    /// Loss and accuracy of the student on the eval batch.
    pub fn evaluate<E: Exec>(&self, e: &mut E) -> Res<(f32, f32)> {
        evaluate(e, &self.net, &self.eval_x, &self.eval_y, &self.eval_metrics)
    }
}

pub struct Outcome {
    pub curve: Vec<Point>,
    pub net: Net,
    pub eval_x: Storage,
    pub eval_y: Storage,
    /// Wall time of the training loop (evaluations included).
    pub seconds: f64,
}

/// The whole run: set-up, `s.steps` training steps, an evaluation every
/// `s.every`. The allocation sequence (and with it the order in which
/// owned tensors are dropped) depends only on `s`: the dry run reproduces
/// it exactly.
///
/// Nothing is freed by hand: every tensor is a [`Storage`] whose last owner
/// drops it (activations during the backward pass, gradients after the
/// update, each batch at the end of its step, the prefetch queue and the
/// teacher at the end of the run); the arena frees the blocks at its next
/// allocation or compaction, after the streams that used them.
pub fn train<E: Exec>(e: &mut E, p: &Problem, s: &Settings, log: bool) -> Res<Outcome> {
    let mut sched = Rng::new(s.seed ^ 0x5c4e_d01e);
    let mut data = Rng::new(s.seed ^ 0xda7a);
    let mut buf = Vec::new();
    let pool: Vec<f32> = if s.data_pool && e.arena().backend().stores_bytes() {
        (0..4 * s.max_batch * IN).map(|_| data.normal()).collect()
    } else {
        Vec::new()
    };
    let run = Setup::new(e, p)?;
    let (eval_loss, eval_acc) = run.evaluate(e)?;
    let p0 = Point {
        step: 0,
        batch: 0,
        train: None,
        eval_loss,
        eval_acc,
    };
    if log {
        p0.print(e.arena());
    }
    let mut curve = vec![p0];
    let started = Instant::now();
    let mut since = 0;
    let mut queue = VecDeque::new();
    for _ in 0..PREFETCH {
        queue.push_back(make_batch(e, s, &mut sched, &mut data, &mut buf, &pool)?);
    }
    for step in 1..=s.steps {
        let batch = queue.pop_front().ok_or("empty prefetch queue")?;
        take_batch(e, &run.teacher, &batch)?;
        let n = batch.n;
        let mut fwd = forward(e, &run.net, &batch.x, n, true)?;
        let logits = fwd.z.pop().ok_or("no logits")?;
        let dlogits =
            loss(e, &logits, &batch.y, n, &run.train_metrics, true)?.ok_or("no gradient")?;
        drop(logits);
        // The data loader starts the upload of a batch now, on its own
        // stream: it lands among this step's activations and outlives them.
        queue.push_back(make_batch(e, s, &mut sched, &mut data, &mut buf, &pool)?);
        let grads = backward(e, &run.net, &batch.x, n, fwd, dlogits, |_, _, _| Ok(()))?;
        update(
            e,
            &run.net,
            grads,
            s.lr_at(step - 1),
            s.momentum,
            &mut sched,
        )?;
        drop(batch);
        since += 1;

        if step % s.every == 0 || step == s.steps {
            let train = take_metrics(e, &run.train_metrics, since)?;
            since = 0;
            let (eval_loss, eval_acc) = run.evaluate(e)?;
            let point = Point {
                step,
                batch: n,
                train: Some(train),
                eval_loss,
                eval_acc,
            };
            if log {
                point.print(e.arena());
            }
            curve.push(point);
        }
    }
    drop(queue);
    // The teacher and the accumulators are dropped at the end of the call.
    let Setup {
        net,
        eval_x,
        eval_y,
        ..
    } = run;
    Ok(Outcome {
        curve,
        net,
        eval_x,
        eval_y,
        seconds: started.elapsed().as_secs_f64(),
    })
}
