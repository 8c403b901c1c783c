//! Reading the start of a run from the safetensors file
//! `scripts/gpt2_reference.py init` writes: every value checked, with an
//! error naming the file, the key and what is allowed, before anything
//! large is allocated.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use crate::model::{le_words, Batch, Config, Hyper, Layout, Start};
use crate::Res;

/// Largest file read: GPT-2 small with its batches is about 0.5 GB.
pub const MAX_FILE_BYTES: u64 = 4 << 30;

/// Most steps a run takes (`--steps` has the same bound).
pub const MAX_STEPS: usize = 10_000;

/// The bytes of `path`, a regular file of at most [`MAX_FILE_BYTES`].
pub fn read_bounded(path: &Path) -> Res<Vec<u8>> {
    let p = path.display();
    let md = std::fs::metadata(path).map_err(|e| format!("cannot read {p}: {e}"))?;
    if !md.is_file() {
        return Err(format!("{p} is not a regular file").into());
    }
    if md.len() > MAX_FILE_BYTES {
        return Err(format!(
            "{p} is {} bytes; at most {MAX_FILE_BYTES} are read",
            md.len()
        )
        .into());
    }
    // Bounded read too: the file may grow after the check above.
    let mut bytes = Vec::with_capacity(md.len() as usize);
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read {p}: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("{p} grew past {MAX_FILE_BYTES} bytes while being read").into());
    }
    Ok(bytes)
}

fn meta<T: std::str::FromStr>(m: &HashMap<String, String>, key: &str, what: &str) -> Res<T> {
    let v = m
        .get(key)
        .ok_or_else(|| format!("{what}: metadata has no `{key}`"))?;
    v.parse()
        .map_err(|_| format!("{what}: metadata `{key}` = `{v}` is not a valid number").into())
}

/// A dimension in 1..=max.
fn dim(m: &HashMap<String, String>, key: &str, max: usize, what: &str) -> Res<usize> {
    let x: usize = meta(m, key, what)?;
    if x == 0 || x > max {
        return Err(format!("{what}: `{key}` = {x}; give 1 to {max}").into());
    }
    Ok(x)
}

/// A float in `lo..hi` (`hi` excluded unless `closed`).
fn real(m: &HashMap<String, String>, key: &str, lo: f32, hi: f32, what: &str) -> Res<f32> {
    let x: f32 = meta(m, key, what)?;
    if !(x.is_finite() && x >= lo && x < hi) {
        return Err(format!("{what}: `{key}` = {x}; give a value in [{lo}, {hi})").into());
    }
    Ok(x)
}

/// Reads `path`; `steps` takes the first batches only.
pub fn load(path: &Path, steps: Option<usize>) -> Res<Start> {
    let bytes = read_bounded(path)?;
    let what = path.display().to_string();
    let what = what.as_str();
    let st = SafeTensors::deserialize(&bytes).map_err(|e| format!("{what}: {e}"))?;
    let (_, md) = SafeTensors::read_metadata(&bytes).map_err(|e| format!("{what}: {e}"))?;
    let m = md
        .metadata()
        .clone()
        .ok_or_else(|| format!("{what}: no metadata"))?;
    // n_embd: layernorm_bwd keeps 2 * n_embd floats in shared memory (48 KiB).
    let cfg = Config {
        vocab: dim(&m, "vocab", 1 << 20, what)?,
        ctx: dim(&m, "n_positions", 1 << 14, what)?,
        c: dim(&m, "n_embd", 6144, what)?,
        layers: dim(&m, "n_layer", 256, what)?,
        heads: dim(&m, "n_head", 256, what)?,
    };
    if cfg.c % cfg.heads != 0 || cfg.c % 4 != 0 {
        return Err(format!(
            "{what}: n_embd {} must be a multiple of 4 and of n_head {}",
            cfg.c, cfg.heads
        )
        .into());
    }
    let hyper = Hyper {
        lr: real(&m, "lr", 0.0, 1.0, what)?,
        beta1: real(&m, "beta1", 0.0, 1.0, what)?,
        beta2: real(&m, "beta2", 0.0, 1.0, what)?,
        eps: real(&m, "eps", f32::MIN_POSITIVE, 1.0, what)?,
        weight_decay: real(&m, "weight_decay", 0.0, 1e3, what)?,
        grad_clip: real(&m, "grad_clip", f32::MIN_POSITIVE, f32::MAX, what)?,
    };
    let have = dim(&m, "steps", MAX_STEPS, what)?;
    let n = steps.unwrap_or(have);
    if n > have {
        return Err(format!("{what} holds {have} batches; {n} steps asked").into());
    }
    let lay = Layout::new(cfg);
    let known = |name: &str| {
        lay.params.iter().any(|p| p.0 == name)
            || name
                .strip_prefix("tokens.")
                .and_then(|s| s.parse::<usize>().ok())
                .is_some_and(|s| s < have)
    };
    if let Some(extra) = st.names().into_iter().find(|n| !known(n)) {
        return Err(format!(
            "{what}: unexpected tensor `{extra}` (not GPT-2's, nor tokens.0..{have})"
        )
        .into());
    }
    let weights = lay.gather(&st, what)?;
    if let Some((name, _, _)) = lay.params.iter().find(|(_, shape, at)| {
        weights[*at..at + shape.iter().product::<usize>()]
            .iter()
            .any(|x| !x.is_finite())
    }) {
        return Err(format!("{what}: tensor {name} holds a value that is not finite").into());
    }
    let mut batches = Vec::with_capacity(n);
    for s in 0..n {
        let name = format!("tokens.{s}");
        let t = st
            .tensor(&name)
            .map_err(|e| format!("{what}: {name}: {e}"))?;
        let (b, t1) = match (t.dtype(), t.shape()) {
            (Dtype::I32, &[b, t1]) if b > 0 && t1 >= 2 => (b, t1),
            (d, s) => {
                return Err(format!(
                    "{what}: {name} is {d:?} {s:?}, expected I32 (B >= 1, T + 1 >= 2)"
                )
                .into())
            }
        };
        let tokens: Vec<i32> = le_words(t.data(), i32::from_le_bytes).collect();
        if t1 - 1 > cfg.ctx {
            return Err(format!(
                "{what}: {name}: sequence length {} exceeds the context {}",
                t1 - 1,
                cfg.ctx
            )
            .into());
        }
        if let Some(bad) = tokens.iter().find(|&&x| x < 0 || x as usize >= cfg.vocab) {
            return Err(format!(
                "{what}: {name}: token {bad} outside the vocabulary of {}",
                cfg.vocab
            )
            .into());
        }
        batches.push(Batch {
            b,
            t: t1 - 1,
            tokens,
        });
    }
    Ok(Start {
        cfg,
        hyper,
        weights,
        batches,
    })
}
