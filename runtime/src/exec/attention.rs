//! The attention phases of a layer: `QkvHeads` (q, k, v projections per head, with bias and
//! RoPE; under a cache a streamed matrix is read from its slot) and `AttnHeads` (each query
//! head against the KV cache), and their finishes (k and v into the KV cache; heads gathered
//! into token rows for the output projection).

use super::blocks::{grow, split_blocks, units};
use super::compute::Work;
use super::executor::{StepState, Tensor};
use super::weights::read_slot;
use crate::model::attention::attend;
use crate::model::ops::rms_norm_in_place;
use crate::model::{KvCache, Model};
use crate::neuron::Phase;
use crate::quant::{Layout, MatRef};

impl StepState {
    /// `QkvHeads`: cluster `c` owning heads `a..b` writes `[head][token][head_dim]`.
    pub(super) fn compute_qkv_heads(&self, w: Work<'_>, buf: &mut Vec<f32>) {
        let Work {
            model,
            work,
            clusters,
            runner,
            cx,
            n,
            ..
        } = w;
        let c = model.config();
        let hd = c.head_dim as usize;
        let l = model
            .layers()
            .get(work.layer as usize)
            .expect("attention phases belong to a layer");
        let (window, rope_config) = c.layer_attention(work.layer as usize);
        let rope = match window {
            Some(_) => &self.rope_swa,
            None => &self.rope,
        };
        let acts = &self.acts;
        let (n_head, n_kv) = (c.n_head as usize, c.n_head_kv as usize);
        grow(buf, (n_head + 2 * n_kv) * n * hd);
        let first = clusters.first().map_or(0, |r| r.start as usize);
        let len: usize = clusters.iter().map(|r| r.len()).sum();
        let mut outs = split_blocks(
            &mut buf[first * n * hd..(first + len) * n * hd],
            clusters.iter().map(|r| r.len() * n * hd),
        );
        // Streamed attention: cluster `c` is matrix `c` (q, k, v), in its cache slot.
        let streamed = self.cache.as_deref().filter(|a| a.streams(Phase::QkvHeads));
        let (first_cluster, layer_index) = (work.clusters.start, work.layer);
        runner.run(&mut outs, &|_, i, out| {
            let slot = streamed.map(|a| {
                let c = a
                    .map()
                    .unit_cluster(Phase::QkvHeads, first_cluster + i as u32);
                read_slot(a, layer_index, c, || {
                    format!("attention unit {c} computed before it was loaded")
                })
            });
            for (k, head) in units(&clusters[i]).enumerate() {
                let dst = &mut out[k * n * hd..(k + 1) * n * hd];
                let (w, bias, row0, rotate, norm) = if head < n_head {
                    (&l.wq, &l.bq, head * hd, true, &l.q_norm)
                } else if head < n_head + n_kv {
                    (&l.wk, &l.bk, (head - n_head) * hd, true, &l.k_norm)
                } else {
                    (&l.wv, &l.bv, (head - n_head - n_kv) * hd, false, &None)
                };
                let q_scale = (head < n_head && c.q_scale != 1.0).then_some(c.q_scale);
                let mat = match &slot {
                    Some(slot) => {
                        let rb = w.row_bytes();
                        let at = row0 * rb;
                        MatRef {
                            ty: w.ty,
                            data: &slot.bytes()[at..at + hd * rb],
                            rows: hd,
                            cols: w.cols,
                            layout: Layout::Rows,
                        }
                    }
                    None => model.rows(w, row0..row0 + hd),
                };
                cx.project(mat, acts.get(w.ty), n, dst, hd);
                for t in 0..n {
                    let v = &mut dst[t * hd..(t + 1) * hd];
                    if let Some(b) = bias {
                        v.iter_mut()
                            .zip(&b[row0..row0 + hd])
                            .for_each(|(x, b)| *x += b);
                    }
                    if let Some(weight) = norm {
                        rms_norm_in_place(v, weight, c.rms_eps);
                    }
                    if rotate {
                        rope.apply(rope_config.style, t, v);
                    }
                    if let Some(scale) = q_scale {
                        v.iter_mut().for_each(|x| *x *= scale);
                    }
                }
            }
        });
    }

    /// `AttnHeads`: cluster `c` owning query heads `a..b` writes `[head][token][head_dim]`.
    /// In a multi-sequence step token `t` attends to its own sequence's cache `kv[t]`, up to
    /// its own position, exactly as that sequence's own decode step would.
    pub(super) fn compute_attn_heads(&self, w: Work<'_>, kv: &[KvCache], buf: &mut Vec<f32>) {
        let Work {
            model,
            work,
            clusters,
            runner,
            cx,
            scratch,
            n,
            ..
        } = w;
        let c = model.config();
        let hd = c.head_dim as usize;
        let multi = self.request.is_multi_sequence();
        let positions = &self.positions;
        let (kernels, qkv) = (cx.kernels, &self.qkv);
        let group = (c.n_head / c.n_head_kv) as usize;
        let scale = c.kq_scale;
        let layer_index = work.layer as usize;
        let (window, _) = c.layer_attention(layer_index);
        grow(buf, c.n_head as usize * n * hd);
        let first = clusters.first().map_or(0, |r| r.start as usize);
        let len: usize = clusters.iter().map(|r| r.len()).sum();
        let mut outs = split_blocks(
            &mut buf[first * n * hd..(first + len) * n * hd],
            clusters.iter().map(|r| r.len() * n * hd),
        );
        runner.run(&mut outs, &|worker, i, out| {
            let mut s = scratch[worker].lock().unwrap_or_else(|e| e.into_inner());
            for (k, head) in units(&clusters[i]).enumerate() {
                for t in 0..n {
                    let cache = &kv[if multi { t } else { 0 }];
                    let keys = cache.keys(layer_index, head / group);
                    let values = cache.values(layer_index, head / group);
                    let q = &qkv[(head * n + t) * hd..(head * n + t + 1) * hd];
                    let o = &mut out[(k * n + t) * hd..(k * n + t + 1) * hd];
                    let n_kv = positions[t] as usize + 1;
                    // A sliding window sees the last `window` positions only.
                    let from = window.map_or(0, |w| n_kv.saturating_sub(w as usize));
                    // One numerics for every query, however many the step holds (a prompt
                    // in any chunks, decode, other sequences'): the f32 tiled path.
                    let (k, v) = (&keys[from * hd..], &values[from * hd..]);
                    attend(kernels, q, k, v, n_kv - from, scale, &mut s.attn, o);
                }
            }
        });
    }

    /// After `QkvHeads` of layer `l`: k and v into the KV cache (and q, k, v to the probe).
    pub(super) fn finish_qkv_heads(&mut self, model: &Model, kv: &mut [KvCache], l: usize) {
        let c = model.config();
        let n = self.request.n_tokens as usize;
        let hd = c.head_dim as usize;
        let (n_head, n_kv) = (c.n_head as usize, c.n_head_kv as usize);
        let n_past = self.request.n_past as usize;
        if self.probe.is_some() {
            // Token-major copies of q, k, v (after RoPE) for the probe only.
            for (name, first, heads) in [
                ("Qcur", 0, n_head),
                ("Kcur", n_head, n_kv),
                ("Vcur", n_head + n_kv, n_kv),
            ] {
                let w = heads * hd;
                self.gathered.resize(n * w, 0.0);
                for h in 0..heads {
                    for t in 0..n {
                        let src = ((first + h) * n + t) * hd;
                        self.gathered[t * w + h * hd..t * w + (h + 1) * hd]
                            .copy_from_slice(&self.qkv[src..src + hd]);
                    }
                }
                self.emit(|| format!("{name}-{l}"), Tensor::Gathered, w);
            }
        }
        if self.request.is_multi_sequence() {
            // Token `t` into its own sequence's cache, at its own position.
            for (t, cache) in kv.iter_mut().enumerate().take(n) {
                let pos = self.positions[t] as usize;
                for j in 0..n_kv {
                    for (head, is_value) in [(n_head + j, false), (n_head + n_kv + j, true)] {
                        let at = (head * n + t) * hd;
                        let src = &self.qkv[at..at + hd];
                        cache.store(&self.kernels, l, j, is_value, pos, src);
                    }
                }
            }
            return;
        }
        let kv = &mut kv[0];
        for j in 0..n_kv {
            let k = n_head + j;
            let v = n_head + n_kv + j;
            let kernels = &self.kernels;
            kv.store(
                kernels,
                l,
                j,
                false,
                n_past,
                &self.qkv[k * n * hd..(k + 1) * n * hd],
            );
            kv.store(
                kernels,
                l,
                j,
                true,
                n_past,
                &self.qkv[v * n * hd..(v + 1) * n * hd],
            );
        }
    }

    /// After `AttnHeads` of layer `l`: the heads gathered into token rows `[token][q_dim]` and
    /// quantized for the output projection.
    pub(super) fn finish_attn_heads(&mut self, model: &Model, l: usize) {
        let c = model.config();
        let n = self.request.n_tokens as usize;
        let hd = c.head_dim as usize;
        let q_dim = c.q_dim() as usize;
        self.gathered.resize(n * q_dim, 0.0);
        for h in 0..c.n_head as usize {
            for t in 0..n {
                self.gathered[t * q_dim + h * hd..t * q_dim + (h + 1) * hd]
                    .copy_from_slice(&self.attn[(h * n + t) * hd..(h * n + t + 1) * hd]);
            }
        }
        let wo = model.layers()[l].wo.ty;
        self.acts
            .prepare(&self.kernels, &self.gathered, q_dim, &[wo]);
        self.emit(|| format!("kqv_out-{l}"), Tensor::Gathered, q_dim);
    }
}
