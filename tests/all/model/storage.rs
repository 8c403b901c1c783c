//! Owned storage in the model: what each storage holds and who owns it,
//! and the steps on storages (alloc, clone, slice, drop, reclaim, range
//! writes and reads, copies, fills) and on streams, each checked against
//! the model.

use cuarena::backend::Backend;
use cuarena::{Arena, AsRange, Error, Handle, Storage, StorageSlice};

use super::driver::{pattern, Model};
use super::ops::Op;
use cuarena::DType;

/// What a storage holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Bytes,
    U32,
    F32,
}

impl Kind {
    fn elem(self) -> u64 {
        match self {
            Kind::Bytes => 1,
            Kind::U32 | Kind::F32 => 4,
        }
    }
}

/// An owner of a storage: a clone or a slice.
enum Owner {
    Whole(Storage),
    Slice(StorageSlice),
}

impl Owner {
    fn storage(&self) -> &Storage {
        match self {
            Owner::Whole(s) => s,
            Owner::Slice(s) => s.storage(),
        }
    }
}

pub(super) struct ModelStorage {
    /// Never empty: the storage is dropped with its last owner.
    owners: Vec<Owner>,
    pub(super) kind: Kind,
    pub(super) handle: Option<Handle>,
    pub(super) size: u64,
    pub(super) reserved: u64,
    pub(super) align: u64,
    pub(super) data: Vec<u8>,
}

impl ModelStorage {
    pub(super) fn storage(&self) -> &Storage {
        self.owners[0].storage()
    }

    /// Elements `a..b` of the storage, reduced modulo its length + 1.
    fn range(&self, a: u64, b: u64) -> StorageSlice {
        let n = self.storage().numel() + 1;
        let (a, b) = (a % n, b % n);
        self.storage()
            .slice(a.min(b)..a.max(b))
            .expect("in-range slice")
    }
}

pub(super) fn read_bytes<B: Backend>(
    a: &Arena<B>,
    r: &impl AsRange,
    kind: Kind,
) -> cuarena::Result<Vec<u8>> {
    Ok(match kind {
        Kind::Bytes => a.read_bytes(r)?,
        Kind::U32 => bytemuck::cast_slice(&a.read::<u32>(r)?).to_vec(),
        Kind::F32 => bytemuck::cast_slice(&a.read::<f32>(r)?).to_vec(),
    })
}

/// `data` as `T`s (a trailing part of an element is dropped).
fn collect<T: bytemuck::Pod>(data: &[u8]) -> Vec<T> {
    data.chunks_exact(std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

fn write_bytes<B: Backend>(
    a: &mut Arena<B>,
    r: &impl AsRange,
    kind: Kind,
    data: &[u8],
) -> cuarena::Result<()> {
    match kind {
        Kind::Bytes => a.write_bytes(r, data),
        Kind::U32 => a.write(r, &collect::<u32>(data)),
        Kind::F32 => a.write(r, &collect::<f32>(data)),
    }
}

impl<B: Backend> Model<'_, B> {
    /// The storage, stream, copy and fill ops.
    pub(super) fn storage_step(
        &mut self,
        op: &Op,
        step: usize,
        before: &[(u64, u64, u32)],
        st: &cuarena::Stats,
    ) {
        let n = self.storages.len();
        let pending = self.arena.stats().pending_reclaim;
        let stores = self.arena.backend().stores_bytes();
        match *op {
            Op::AllocStorage { kind, len } => {
                let (kind, zeroed) = match kind % 4 {
                    0 => (Kind::Bytes, false),
                    1 => (Kind::U32, false),
                    2 => (Kind::F32, false),
                    _ => (Kind::U32, true),
                };
                let r = match (kind, zeroed) {
                    (Kind::Bytes, _) => self.arena.alloc_storage(len),
                    (Kind::U32, false) => self.arena.alloc_storage_dtype(DType::U32, len),
                    (Kind::U32, true) => self
                        .arena
                        .alloc_storage_dtype(DType::U32, len)
                        .and_then(|s| self.arena.fill(&s, 0u32).map(|()| s)),
                    (Kind::F32, _) => self.arena.alloc_storage_dtype(DType::F32, len),
                };
                let size = len * kind.elem();
                let align = kind.elem().max(self.granule);
                let pending_free = self.pending_reserved();
                if size > 0 {
                    // Past its argument checks: the queue was drained.
                    self.drained();
                }
                let storage = match r {
                    Ok(s) => s,
                    Err(e) => {
                        self.check_oom(e, size, align, step, before, st, pending_free);
                        return;
                    }
                };
                assert_eq!(
                    (storage.numel(), storage.len_bytes(), storage.is_empty()),
                    (len, size, size == 0),
                    "step {step}"
                );
                assert_eq!(storage.handle().is_some(), size > 0, "step {step}");
                assert_eq!(storage.owners(), 1);
                let data = if zeroed {
                    vec![0; size as usize]
                } else {
                    let data = pattern(step as u64 * 7 + 3, size);
                    write_bytes(self.arena, &storage, kind, &data).expect("write new storage");
                    data
                };
                self.storages.push(ModelStorage {
                    handle: storage.handle(),
                    owners: vec![Owner::Whole(storage)],
                    kind,
                    size,
                    reserved: size.div_ceil(self.granule) * self.granule,
                    align,
                    data,
                });
            }
            Op::CloneStorage { idx } if n > 0 => {
                let s = &mut self.storages[idx % n];
                let c = s.storage().clone();
                assert!(c.same_storage(s.storage()));
                s.owners.push(Owner::Whole(c));
                assert_eq!(s.storage().owners(), s.owners.len() as u64, "step {step}");
            }
            Op::SliceStorage { idx, a, b } if n > 0 => {
                let s = &mut self.storages[idx % n];
                let len = s.storage().numel();
                let (a, b) = (a % (len + 2), b % (len + 2));
                let (a, b) = (a.min(b), a.max(b));
                match s.storage().slice(a..b) {
                    Ok(sl) => {
                        assert!(b <= len, "step {step}: slice {a}..{b} of {len}");
                        let e = s.kind.elem();
                        assert_eq!(
                            (sl.offset_bytes(), sl.len_bytes(), sl.numel()),
                            (a * e, (b - a) * e, b - a)
                        );
                        s.owners.push(Owner::Slice(sl));
                    }
                    Err(Error::OutOfBounds { .. }) => assert!(b > len, "step {step}"),
                    Err(e) => panic!("step {step}: {e}"),
                }
            }
            Op::DropOwner { idx, which } if n > 0 => {
                let i = idx % n;
                let s = &mut self.storages[i];
                s.owners.swap_remove(which % s.owners.len());
                if s.owners.is_empty() {
                    let s = self.storages.swap_remove(i);
                    if let Some(h) = s.handle {
                        self.pending.push((h, s.size, s.reserved));
                    }
                } else {
                    assert_eq!(s.storage().owners(), s.owners.len() as u64, "step {step}");
                }
                assert_eq!(
                    self.arena.stats().pending_reclaim,
                    self.pending.len() as u64,
                    "step {step}"
                );
            }
            Op::Reclaim => {
                let freed = self.arena.reclaim().expect("reclaim");
                assert_eq!(freed, self.pending.len() as u64, "step {step}");
                self.drained();
                assert_eq!(self.arena.stats().pending_reclaim, 0);
            }
            Op::WriteRange { idx, a, b, seed } if n > 0 => {
                let s = &self.storages[idx % n];
                let r = s.range(a, b);
                let (off, len) = (r.offset_bytes() as usize, r.len_bytes());
                let kind = s.kind;
                match seed % 8 {
                    0 => {
                        // One element too many.
                        let data = pattern(seed as u64, len + kind.elem());
                        let e = write_bytes(self.arena, &r, kind, &data).unwrap_err();
                        assert!(
                            matches!(e, Error::LengthMismatch { .. }),
                            "step {step}: {e}"
                        );
                        self.unchanged(step, "a wrong-length write", before, st, pending);
                    }
                    1 if kind != Kind::Bytes && len > 0 => {
                        let other = if kind == Kind::U32 {
                            Kind::F32
                        } else {
                            Kind::U32
                        };
                        let data = pattern(seed as u64, len);
                        let e = write_bytes(self.arena, &r, other, &data).unwrap_err();
                        assert!(matches!(e, Error::TypeMismatch { .. }), "step {step}: {e}");
                        self.unchanged(step, "a wrong-type write", before, st, pending);
                    }
                    _ => {
                        let data = pattern(step as u64 * 256 + seed as u64, len);
                        write_bytes(self.arena, &r, kind, &data).expect("write_range");
                        let s = &mut self.storages[idx % n];
                        s.data[off..off + data.len()].copy_from_slice(&data);
                    }
                }
            }
            Op::ReadRange { idx, a, b } if n > 0 => {
                let s = &self.storages[idx % n];
                let r = s.range(a, b);
                let got = read_bytes(self.arena, &r, s.kind).expect("read_range");
                let off = r.offset_bytes() as usize;
                assert_eq!(got.len() as u64, r.len_bytes());
                if stores {
                    assert!(
                        got == s.data[off..off + got.len()],
                        "step {step}: read_range of {} B at {off}",
                        got.len()
                    );
                }
            }
            Op::CopyRange {
                src,
                dst,
                len,
                at,
                to,
                extra,
            } if n > 0 => {
                let (i, j) = (src % n, dst % n);
                let (si, sj) = (&self.storages[i], &self.storages[j]);
                let e = si.kind.elem().max(sj.kind.elem());
                let units = si.size.min(sj.size) / e;
                let l = (len % (units + 1)) * e;
                let so = (at % ((si.size - l) / e + 1)) * e;
                let d_o = (to % ((sj.size - l) / e + 1)) * e;
                let dl = if extra && d_o + l + e <= sj.size {
                    l + e
                } else {
                    l
                };
                let (ei, ej) = (si.kind.elem(), sj.kind.elem());
                let sr = si.storage().slice(so / ei..(so + l) / ei).expect("src");
                let dr = sj.storage().slice(d_o / ej..(d_o + dl) / ej).expect("dst");
                let (ki, kj) = (si.kind, sj.kind);
                let r = self.arena.copy(&sr, &dr);
                let overlap = i == j && so < d_o + l && d_o < so + l && l > 0;
                let typed_apart = ki != Kind::Bytes && kj != Kind::Bytes && ki != kj;
                let both = si.handle.is_some() && sj.handle.is_some();
                let want = if dl != l {
                    "length"
                } else if both && typed_apart {
                    "type"
                } else if overlap {
                    "overlap"
                } else {
                    "ok"
                };
                match (want, r) {
                    ("ok", Ok(())) => {
                        let bytes = self.storages[i].data[so as usize..(so + l) as usize].to_vec();
                        self.storages[j].data[d_o as usize..(d_o + l) as usize]
                            .copy_from_slice(&bytes);
                    }
                    ("length", Err(Error::LengthMismatch { .. }))
                    | ("type", Err(Error::TypeMismatch { .. }))
                    | ("overlap", Err(Error::Overlap { .. })) => {
                        self.unchanged(step, "a bad copy", before, st, pending);
                    }
                    (want, r) => panic!("step {step}: copy expected {want}, got {r:?}"),
                }
            }
            Op::FillRange {
                idx,
                a,
                b,
                width,
                seed,
            } if n > 0 => {
                let i = idx % n;
                let s = &self.storages[i];
                let r = s.range(a, b);
                let (off, len) = (r.offset_bytes() as usize, r.len_bytes());
                let kind = s.kind;
                let w: u64 = [1, 2, 4, 8, 1, 1, 1][(width % 7) as usize];
                let p = pattern(seed as u64 + 1, w);
                let res = match width % 7 {
                    0 => self.arena.fill(&r, p[0]),
                    1 => self.arena.fill(&r, bytemuck::pod_read_unaligned::<u16>(&p)),
                    2 if kind == Kind::F32 => {
                        self.arena.fill(&r, bytemuck::pod_read_unaligned::<f32>(&p))
                    }
                    2 => self.arena.fill(&r, bytemuck::pod_read_unaligned::<u32>(&p)),
                    3 => self.arena.fill(&r, bytemuck::pod_read_unaligned::<u64>(&p)),
                    // Any dtype, reinterpreted as bytes.
                    _ => r
                        .as_dtype(DType::U8)
                        .and_then(|bytes| self.arena.fill(&bytes, p[0])),
                };
                let bytes_fill = width % 7 >= 4;
                let type_ok = bytes_fill || kind == Kind::Bytes || w == 4;
                // Checked against the dtype even when empty.
                let want = if !type_ok {
                    "type"
                } else if s.handle.is_none() {
                    "ok"
                } else if !bytes_fill && w > 1 && (len % w != 0 || off as u64 % w != 0) {
                    // Whole elements at an offset aligned to their size.
                    "whole"
                } else {
                    "ok"
                };
                match (want, res) {
                    ("ok", Ok(())) => {
                        let d = &mut self.storages[i].data[off..off + len as usize];
                        for (k, byte) in d.iter_mut().enumerate() {
                            *byte = p[k % w as usize];
                        }
                    }
                    ("type", Err(Error::TypeMismatch { .. }))
                    | ("whole", Err(Error::Misaligned { .. })) => {
                        self.unchanged(step, "a bad fill", before, st, pending);
                    }
                    (want, r) => {
                        panic!("step {step}: fill of {w} B over {len} B expected {want}, got {r:?}")
                    }
                }
            }
            Op::RecordStream { idx, stream } => {
                let k = stream as usize % (self.streams.len() + 1);
                let id = self.streams.get(k).copied().unwrap_or(self.bogus_stream);
                let r = match self.storages.get(idx % n.max(1)) {
                    Some(s) if idx % 2 == 0 => self
                        .arena
                        .record_stream(s.range(idx as u64, idx as u64 / 3), id),
                    Some(s) => self.arena.record_stream(s.storage(), id),
                    None => return,
                };
                self.check_stream_result(r, k, step, before, st, pending);
            }
            Op::WaitOnArena { stream } => {
                let k = stream as usize % (self.streams.len() + 1);
                let id = self.streams.get(k).copied().unwrap_or(self.bogus_stream);
                let r = self.arena.wait_on_arena(id);
                self.check_stream_result(r, k, step, before, st, pending);
            }
            _ => {}
        }
    }

    fn check_stream_result(
        &self,
        r: cuarena::Result<()>,
        k: usize,
        step: usize,
        before: &[(u64, u64, u32)],
        st: &cuarena::Stats,
        pending: u64,
    ) {
        if k < self.streams.len() {
            r.expect("a registered stream");
        } else {
            assert_eq!(
                r,
                Err(Error::Foreign {
                    kind: "stream",
                    owner: self.bogus_stream.arena_id(),
                    arena: self.arena.id(),
                }),
                "step {step}"
            );
            self.unchanged(step, "an unknown stream", before, st, pending);
        }
    }
}
