//! The model on the arena: parameters, forward and backward passes, the
//! data loader and the training loop.

use super::*;

// ---- the model on the arena -------------------------------------------------------

pub(crate) fn alloc_f32<E: Exec>(e: &mut E, n: usize) -> Res<Handle> {
    Ok(e.arena().alloc_elems::<f32>(n)?)
}

pub(crate) fn free<E: Exec>(e: &mut E, h: Handle) -> Res<()> {
    Ok(e.arena().free(h)?)
}

/// A layer's parameters (and momentum, for the student) in the arena.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layer {
    pub(crate) w: Handle,
    pub(crate) b: Handle,
    pub(crate) momentum: Option<(Handle, Handle)>,
    pub(crate) fan_in: usize,
    pub(crate) fan_out: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Net {
    pub(crate) layers: Vec<Layer>,
}

impl Net {
    pub(crate) fn upload<E: Exec>(e: &mut E, host: &HostNet, momentum: bool) -> Res<Self> {
        let mut layers = Vec::new();
        for l in &host.layers {
            let w = alloc_f32(e, l.w.len())?;
            e.arena().write(w, &l.w)?;
            let b = alloc_f32(e, l.b.len())?;
            e.arena().write(b, &l.b)?;
            let momentum = if momentum {
                let vw = alloc_f32(e, l.w.len())?;
                e.arena().write(vw, &vec![0.0f32; l.w.len()])?;
                let vb = alloc_f32(e, l.b.len())?;
                e.arena().write(vb, &vec![0.0f32; l.b.len()])?;
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

    pub(crate) fn download<E: Exec>(&self, e: &mut E) -> Res<HostNet> {
        let mut layers = Vec::new();
        for l in &self.layers {
            layers.push(HostLayer {
                w: e.arena().read::<f32>(l.w)?,
                b: e.arena().read::<f32>(l.b)?,
                fan_in: l.fan_in,
                fan_out: l.fan_out,
            });
        }
        Ok(HostNet { layers })
    }
}

/// Activations of a forward pass: `z[i]` before and `h[i]` after the ReLU
/// of hidden layer i; the last `z` is the logits.
pub(crate) struct Fwd {
    pub(crate) z: Vec<Handle>,
    pub(crate) h: Vec<Handle>,
}

/// Forward pass of `n` rows of `x`. With `keep` every activation is kept
/// for the backward pass; without, each is freed as soon as it is used and
/// only the logits are returned.
pub(crate) fn forward<E: Exec>(e: &mut E, net: &Net, x: Handle, n: usize, keep: bool) -> Res<Fwd> {
    let (mut z_all, mut h_all) = (Vec::new(), Vec::new());
    let mut input = x;
    let last = net.layers.len() - 1;
    for (i, l) in net.layers.iter().enumerate() {
        let z = alloc_f32(e, n * l.fan_out)?;
        e.matmul(Op::NN, input, l.w, z, (n, l.fan_out, l.fan_in))?;
        e.bias_add(z, l.b, n, l.fan_out)?;
        if !keep && i > 0 {
            free(e, input)?;
        }
        if i == last {
            z_all.push(z);
            break;
        }
        let h = alloc_f32(e, n * l.fan_out)?;
        e.relu(z, h, n * l.fan_out)?;
        if keep {
            z_all.push(z);
            h_all.push(h);
        } else {
            free(e, z)?;
        }
        input = h;
    }
    Ok(Fwd { z: z_all, h: h_all })
}

/// Loss of `logits` against `labels`, accumulated into `metrics`; returns
/// the gradient of the mean loss when `grad`.
pub(crate) fn loss<E: Exec>(
    e: &mut E,
    logits: Handle,
    labels: Handle,
    n: usize,
    metrics: Handle,
    grad: bool,
) -> Res<Option<Handle>> {
    let stats = alloc_f32(e, 2 * n)?;
    let dlogits = if grad {
        Some(alloc_f32(e, n * CLASSES)?)
    } else {
        None
    };
    e.softmax_xent(logits, labels, dlogits, stats, n, CLASSES)?;
    e.mean2_acc(stats, metrics, n)?;
    free(e, stats)?;
    Ok(dlogits)
}

/// Backward pass; frees the activations as soon as they are used and
/// returns the gradients `(dW, db)` per layer.
pub(crate) fn backward<E: Exec>(
    e: &mut E,
    net: &Net,
    x: Handle,
    n: usize,
    fwd: &Fwd,
    dlogits: Handle,
) -> Res<Vec<(Handle, Handle)>> {
    let mut grads = Vec::with_capacity(net.layers.len());
    let mut dz = dlogits;
    for (i, l) in net.layers.iter().enumerate().rev() {
        let input = if i == 0 { x } else { fwd.h[i - 1] };
        let gw = alloc_f32(e, l.fan_in * l.fan_out)?;
        e.matmul(Op::TN, input, dz, gw, (l.fan_in, l.fan_out, n))?;
        let gb = alloc_f32(e, l.fan_out)?;
        e.col_sum(dz, gb, n, l.fan_out)?;
        grads.push((gw, gb));
        if i == 0 {
            free(e, dz)?;
            break;
        }
        let dh = alloc_f32(e, n * l.fan_in)?;
        e.matmul(Op::NT, dz, l.w, dh, (n, l.fan_in, l.fan_out))?;
        free(e, dz)?;
        free(e, fwd.h[i - 1])?;
        let dz_prev = alloc_f32(e, n * l.fan_in)?;
        e.relu_bwd(dh, fwd.z[i - 1], dz_prev, n * l.fan_in)?;
        free(e, dh)?;
        free(e, fwd.z[i - 1])?;
        dz = dz_prev;
    }
    grads.reverse();
    Ok(grads)
}

/// SGD with momentum on every layer, then frees the gradients in a random
/// order (more holes).
pub(crate) fn update<E: Exec>(
    e: &mut E,
    net: &Net,
    grads: &[(Handle, Handle)],
    lr: f32,
    mu: f32,
    sched: &mut Rng,
) -> Res<()> {
    for (l, &(gw, gb)) in net.layers.iter().zip(grads) {
        let (vw, vb) = l.momentum.ok_or("the student has momentum buffers")?;
        e.sgd(l.w, gw, vw, l.fan_in * l.fan_out, lr, mu)?;
        e.sgd(l.b, gb, vb, l.fan_out, lr, mu)?;
    }
    let mut all: Vec<Handle> = grads.iter().flat_map(|&(w, b)| [w, b]).collect();
    sched.shuffle(&mut all);
    for h in all {
        free(e, h)?;
    }
    Ok(())
}

/// Labels of `n` rows of `x`: the teacher's argmax, computed on the device.
pub(crate) fn label<E: Exec>(e: &mut E, teacher: &Net, x: Handle, y: Handle, n: usize) -> Res<()> {
    let fwd = forward(e, teacher, x, n, false)?;
    let logits = fwd.z[0];
    e.argmax(logits, y, n, CLASSES)?;
    free(e, logits)
}

pub(crate) struct Batch {
    pub(crate) x: Handle,
    pub(crate) y: Handle,
    pub(crate) n: usize,
}

/// The data loader: a batch of random size, Gaussian inputs uploaded from
/// the host, labels from the teacher on the device.
pub(crate) fn make_batch<E: Exec>(
    e: &mut E,
    teacher: &Net,
    s: &Settings,
    sched: &mut Rng,
    data: &mut Rng,
    buf: &mut Vec<f32>,
    pool: &[f32],
) -> Res<Batch> {
    let n = sched.batch(s.min_batch, s.max_batch);
    let x = alloc_f32(e, n * IN)?;
    let y = e.arena().alloc_elems::<i32>(n)?;
    if e.arena().backend().stores_bytes() {
        if pool.len() >= n * IN {
            let start = data.below(pool.len() - n * IN + 1);
            e.arena().write(x, &pool[start..start + n * IN])?;
        } else {
            buf.clear();
            buf.extend((0..n * IN).map(|_| data.normal()));
            e.arena().write(x, buf)?;
        }
    } else {
        // What the write does to the spill policy: x is used.
        e.arena().make_resident(&[x])?;
    }
    label(e, teacher, x, y, n)?;
    Ok(Batch { x, y, n })
}

/// Reads an accumulator `[loss, accuracy]` divided by `count`, and zeroes it.
pub(crate) fn take_metrics<E: Exec>(e: &mut E, m: Handle, count: usize) -> Res<(f32, f32)> {
    let v = e.arena().read::<f32>(m)?;
    e.arena().write(m, &[0.0f32, 0.0])?;
    let c = count.max(1) as f32;
    Ok((v[0] / c, v[1] / c))
}

/// One line of the learning curve.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Point {
    pub(crate) step: usize,
    pub(crate) batch: usize,
    /// Mean loss and accuracy of the training batches since the last point.
    pub(crate) train: Option<(f32, f32)>,
    pub(crate) eval_loss: f32,
    pub(crate) eval_acc: f32,
}

impl Point {
    pub(crate) fn print<B: Backend>(&self, arena: &Arena<B>) {
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
/// freed as it goes).
pub(crate) fn evaluate<E: Exec>(
    e: &mut E,
    net: &Net,
    x: Handle,
    y: Handle,
    metrics: Handle,
) -> Res<(f32, f32)> {
    let f = forward(e, net, x, EVAL_ROWS, false)?;
    loss(e, f.z[0], y, EVAL_ROWS, metrics, false)?;
    free(e, f.z[0])?;
    take_metrics(e, metrics, 1)
}

pub(crate) struct Outcome {
    pub(crate) curve: Vec<Point>,
    pub(crate) net: Net,
    pub(crate) eval_x: Handle,
    pub(crate) eval_y: Handle,
    /// Wall time of the training loop (evaluations included).
    pub(crate) seconds: f64,
}

/// The whole run: set-up, `s.steps` training steps, an evaluation every
/// `s.every`. The allocation sequence depends only on `s` (the dry run
/// reproduces it exactly).
pub(crate) fn train<E: Exec>(
    e: &mut E,
    teacher: &HostNet,
    student: &HostNet,
    eval_inputs: &[f32],
    s: &Settings,
    log: bool,
) -> Res<Outcome> {
    let mut sched = Rng::new(s.seed ^ 0x5c4e_d01e);
    let mut data = Rng::new(s.seed ^ 0xda7a);
    let mut buf = Vec::new();
    let pool: Vec<f32> = if s.data_pool && e.arena().backend().stores_bytes() {
        (0..4 * s.max_batch * IN).map(|_| data.normal()).collect()
    } else {
        Vec::new()
    };
    let teacher_dev = Net::upload(e, teacher, false)?;
    let eval_x = alloc_f32(e, EVAL_ROWS * IN)?;
    e.arena().write(eval_x, eval_inputs)?;
    let eval_y = e.arena().alloc_elems::<i32>(EVAL_ROWS)?;
    label(e, &teacher_dev, eval_x, eval_y, EVAL_ROWS)?;
    let net = Net::upload(e, student, true)?;
    let train_metrics = alloc_f32(e, 2)?;
    e.arena().write(train_metrics, &[0.0f32, 0.0])?;
    let eval_metrics = alloc_f32(e, 2)?;
    e.arena().write(eval_metrics, &[0.0f32, 0.0])?;

    let (eval_loss, eval_acc) = evaluate(e, &net, eval_x, eval_y, eval_metrics)?;
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
        queue.push_back(make_batch(
            e,
            &teacher_dev,
            s,
            &mut sched,
            &mut data,
            &mut buf,
            &pool,
        )?);
    }
    for step in 1..=s.steps {
        let batch = queue.pop_front().ok_or("empty prefetch queue")?;
        let n = batch.n;
        let fwd = forward(e, &net, batch.x, n, true)?;
        let logits = fwd.z[fwd.z.len() - 1];
        let dlogits = loss(e, logits, batch.y, n, train_metrics, true)?.ok_or("no gradient")?;
        free(e, logits)?;
        // The data loader prepares a batch now: it lands among this step's
        // activations and outlives them.
        queue.push_back(make_batch(
            e,
            &teacher_dev,
            s,
            &mut sched,
            &mut data,
            &mut buf,
            &pool,
        )?);
        let grads = backward(e, &net, batch.x, n, &fwd, dlogits)?;
        free(e, batch.y)?;
        free(e, batch.x)?;
        update(e, &net, &grads, s.lr_at(step - 1), s.momentum, &mut sched)?;
        since += 1;

        if step % s.every == 0 || step == s.steps {
            let train = take_metrics(e, train_metrics, since)?;
            since = 0;
            let (eval_loss, eval_acc) = evaluate(e, &net, eval_x, eval_y, eval_metrics)?;
            let p = Point {
                step,
                batch: n,
                train: Some(train),
                eval_loss,
                eval_acc,
            };
            if log {
                p.print(e.arena());
            }
            curve.push(p);
        }
    }
    for b in queue {
        free(e, b.y)?;
        free(e, b.x)?;
    }
    Ok(Outcome {
        curve,
        net,
        eval_x,
        eval_y,
        seconds: started.elapsed().as_secs_f64(),
    })
}
